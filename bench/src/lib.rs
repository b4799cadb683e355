//! `agentloop bench`: the standard workload, measured the same way every time.
//!
//! **The workload.** N invocations run at once, T turns each. On turns 1..T-1 the model
//! proposes two parallel read-only `lookup` calls (call IDs unique per turn, keys that
//! change from turn to turn so the repeat check never fires); on turn T it answers with
//! text built from the last turn's results ("orders=3 open; invoices=2 unpaid"), which
//! the bench checks. Every turn is committed durably (SQLite, WAL, `synchronous=FULL`,
//! fsync'd by group commit) before the next decision. The store lives in a fresh
//! temporary directory on disk, removed afterwards.
//!
//! **The model** is a bench model rather than a scripted-model JSON: a script travels
//! with every `Decide` request and is hashed per turn, so its cost grows with T, which
//! would measure the test model instead of the runtime. It answers at once, so every
//! millisecond measured is the runtime's.
//!
//! **Modes.** `embedded`: one process, the orchestrator calls decision, policy and the
//! tool gateway in-process, and the gateway calls the demo executor in-process too
//! (`agentloop-stack`, embedded wiring); the bench calls the orchestrator's API
//! in-process. `distributed`: decision, policy, tool gateway, effect ledger and
//! orchestrator, plus the demo executor, are gRPC servers on distinct 127.0.0.1 ports,
//! talking gRPC to each other with the shared client and server settings; the bench is
//! a gRPC client. They share one process (and its two cores), so
//! loopback gRPC is measured, not a network. The workload only reads, so the ledger is
//! wired but never written. `cluster`: the production overlay as processes
//! (`deploy/local/cluster`: every service binary with its manifest's file and variables,
//! two orchestrators over PostgreSQL and Redis); the bench creates two databases of its
//! own on the PostgreSQL server it is given, starts the cluster, sends half the
//! invocations to each orchestrator with the caller's JWT, and counts on the wire what the
//! processes ask of PostgreSQL and Redis ([`wire`]). Its model is the scripted one (the
//! decision service is a process of its own): the same decisions as the bench model, as a
//! script each start request carries and the decision service parses once.
//!
//! **Figures.**
//! - `turns_per_s`: turns committed / wall time from the first start request to the
//!   last `Ended` event.
//! - `turn_latency`: for each invocation and each turn after its first, the time
//!   between the previous turn's commit and this one's, from the commit times the
//!   orchestrator stamps on the events (1 ms resolution): decide + policy + two tool
//!   calls + durable commit, with N invocations sharing the machine. Taken from the
//!   stamps rather than at arrival, so a watcher that falls behind and then receives two
//!   turns at once does not record a gap of zero.
//! - `invocation_latency`: start request sent → `Ended` event received.
//! - `cpu_us_per_turn`: user + system CPU time of the whole process (all threads:
//!   runtime, SQLite, bench client) divided by the turns: the orchestration overhead of
//!   one turn, independent of concurrency.
//! - `peak_rss`: `VmHWM` of the process.
//! - `stored_bytes_per_turn`: database pages in use (events, invocation rows, indexes)
//!   after the run, divided by the turns; `event_bytes_per_turn` counts the event bodies
//!   alone.
//! - `fsyncs_per_turn`: fsyncs the store asked for, divided by the turns: one per write
//!   transaction committed (group commit; creates included) and two per WAL checkpoint.
//! - In `cluster` mode, CPU and peak RSS are those of the cluster's processes, summed
//!   (not the bench's, nor PostgreSQL's and Redis's); the SQLite figures give way to
//!   `postgres_statements_per_turn`, `postgres_round_trips_per_turn` and
//!   `redis_commands_per_turn` (by name too), counted over the run: the cost model of
//!   scaling out.
//!
//! **Traces** (`--traces`): every service has its own telemetry, as in its own process,
//! and exports every span (sampled at 100%) over OTLP gRPC to a receiver in this
//! process (the collector's TraceService over tonic) that counts them and keeps none.
//! Its export is a real one, with the batching, encoding and loopback gRPC it costs,
//! and the run's wall and CPU time last until every service has exported what it
//! buffered. `spans_per_turn` tells what arrived; `spans_dropped`, what the services
//! ended but dropped (a full queue: `OTEL_BSP_MAX_QUEUE_SIZE` and the other `OTEL_BSP_*`
//! variables of the bench's environment apply). Without it, nothing is exported
//! (metrics are recorded either way, as in every deployment).
//!
//! **Park mode** (`--park`) measures what a waiting invocation costs: all N invocations
//! start and park in their first model call; once all of them wait, the resident set
//! grown since before the first start, divided by N, is the memory per parked
//! invocation. Then they are released and run to the end.

pub mod cluster;
pub mod wire;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use agentloop_auth::{AuthConfig, AuthMode, DevToken};
use agentloop_decision::{Model, ModelError, ModelReply};
use agentloop_orchestrator::{Api, OrchestratorConfig};
use agentloop_proto::client::Transport;
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::orchestrator_service_client::OrchestratorServiceClient;
use agentloop_proto::v1::orchestrator_service_server::OrchestratorService;
use agentloop_stack::{ServiceTelemetry, ServicesOptions, Stack, StackOptions, Wiring};
use agentloop_store::EventStore;
use agentloop_store::databases::{self, Database};
use agentloop_telemetry::receiver::OtlpReceiver;
use agentloop_telemetry::{Metrics, Telemetry, metrics};
use anyhow::{Context, bail};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::metadata::{Ascii, MetadataValue};

use crate::cluster::{ClusterOptions, LocalCluster};
use crate::wire::{CountingProxy, Protocol};

/// Most invocations one run may start.
pub const MAX_INVOCATIONS: u32 = 1_000_000;
/// Most turns per invocation (the orchestrator's highest step cap).
pub const MAX_TURNS: u32 = 10_000;
/// Start requests in flight at once in park mode (a bounded set of starters, so the
/// bench's own bookkeeping stays out of the memory it measures).
const PARK_STARTERS: usize = 64;
/// How often park mode looks whether every released invocation has ended.
const PARK_POLL: Duration = Duration::from_millis(50);
/// How long a run may take before the bench gives up.
const RUN_TIMEOUT: Duration = Duration::from_secs(3_600);
/// The demo executor's read-only lookup tool.
const LOOKUP: &str = "lookup";

/// Lookup keys (and the demo executor's values for them); each turn takes the next two.
const KEYS: [(&str, &str); 8] = [
    ("profile", "active"),
    ("policy", "refund-under-100"),
    ("orders", "3 open"),
    ("invoices", "2 unpaid"),
    ("address", "Lisbon"),
    ("plan", "pro"),
    ("usage", "71%"),
    ("tickets", "1 open"),
];

/// How the services are wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// One process, in-process ports and executor.
    Embedded,
    /// Five gRPC servers on loopback ports (in this process).
    Distributed,
    /// The production overlay as processes: two orchestrators over PostgreSQL and Redis.
    Cluster,
}

/// The PostgreSQL server `cluster` mode uses unless told otherwise (this machine's).
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// The Redis `cluster` mode uses unless told otherwise (this machine's).
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/";

/// Where `cluster` mode finds what it starts.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// `deploy/local/cluster`.
    pub script: PathBuf,
    /// The service binaries.
    pub bin_dir: PathBuf,
    /// A PostgreSQL server's admin URL: two databases of the bench's own are created on
    /// it, and dropped afterwards.
    pub postgres_url: String,
    /// A Redis for the orchestrators' leases.
    pub redis_url: String,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Invocations, all running at once.
    pub invocations: u32,
    /// Turns per invocation (the last one answers).
    pub turns: u32,
    /// The wiring.
    pub mode: Mode,
    /// Park every invocation in its first model call and measure memory.
    pub park: bool,
    /// Where the temporary data directory goes (the system's temp directory if unset).
    pub dir: Option<PathBuf>,
    /// Authenticate every call: the orchestrator verifies an HS256 token on each, as
    /// with `[auth] mode = "jwt"`.
    pub auth: bool,
    /// Cedar policy files for the default profile: every call is authorized by them
    /// (they must permit the workload's `lookup` calls).
    pub policies: Vec<PathBuf>,
    /// Export every service's spans, sampled at 100%, to an OTLP receiver in this
    /// process.
    pub traces: bool,
    /// What `cluster` mode starts, and on which servers.
    pub cluster: ClusterSettings,
}

impl BenchOptions {
    /// Whether the options go together and are within their bounds.
    ///
    /// # Errors
    ///
    /// Says which option is wrong.
    pub fn check(&self) -> anyhow::Result<()> {
        if !(1..=MAX_INVOCATIONS).contains(&self.invocations) {
            bail!("--invocations must be within 1..={MAX_INVOCATIONS}");
        }
        if !(1..=MAX_TURNS).contains(&self.turns) {
            bail!("--turns must be within 1..={MAX_TURNS}");
        }
        if self.mode == Mode::Cluster {
            if self.park || self.traces {
                bail!("--park and --traces measure in-process services: embedded or distributed");
            }
            if !self.policies.is_empty() {
                bail!(
                    "--policies: the cluster authorizes every call by its manifests' policies \
                     (deploy/k8s/base/config/policies)"
                );
            }
        }
        Ok(())
    }
}

/// Two percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// What park mode measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ParkReport {
    /// Invocations waiting at once.
    pub parked: u64,
    /// Resident set before the first start.
    pub rss_before_bytes: u64,
    /// Resident set once all of them waited.
    pub rss_parked_bytes: u64,
    /// (parked − before) / parked.
    pub bytes_per_parked_invocation: f64,
}

/// The figures of one run (see the module documentation for their definitions).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The wiring.
    pub mode: Mode,
    /// Whether every call was authenticated.
    pub auth: bool,
    /// The policy files every call was authorized by (none: authorization off).
    pub policies: Vec<PathBuf>,
    /// Whether every service exported its spans.
    pub traces: bool,
    /// Spans the receiver got, divided by the turns (0 without traces).
    pub spans_per_turn: f64,
    /// Spans the services ended but never exported (0 without traces).
    pub spans_dropped: u64,
    /// Invocations started.
    pub invocations: u32,
    /// Turns per invocation.
    pub turns_per_invocation: u32,
    /// Invocations that ended `completed` with the expected answer after exactly T turns.
    pub completed: u64,
    /// The others.
    pub failed: u64,
    /// The first failure, if any.
    pub first_failure: Option<String>,
    /// Turns committed.
    pub turns: u64,
    /// Wall time of the run, in seconds.
    pub elapsed_s: f64,
    /// Turns committed per second.
    pub turns_per_s: f64,
    /// Commit-to-commit time of consecutive turns of one invocation; zero in park mode.
    pub turn_latency_ms: Percentiles,
    /// Start request to `Ended` event; zero in park mode.
    pub invocation_latency_ms: Percentiles,
    /// CPU time (user + system, all threads) per turn, in microseconds.
    pub cpu_us_per_turn: f64,
    /// Peak resident set (`VmHWM`), in bytes; in `cluster` mode, the sum of every
    /// process's.
    pub peak_rss_bytes: u64,
    /// The SQLite store's figures (`embedded` and `distributed`).
    #[serde(flatten)]
    pub store: Option<StoreFigures>,
    /// What the processes asked of PostgreSQL and Redis (`cluster`).
    #[serde(flatten)]
    pub backends: Option<BackendFigures>,
    /// Park mode's figures.
    pub park: Option<ParkReport>,
}

/// The embedded store's figures of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoreFigures {
    /// Database bytes in use per turn.
    pub stored_bytes_per_turn: f64,
    /// Event body bytes per turn.
    pub event_bytes_per_turn: f64,
    /// Fsyncs: one per write transaction committed, two per WAL checkpoint.
    pub fsyncs: u64,
    /// Write transactions committed (each carries many invocations' turns).
    pub commits: u64,
    /// `fsyncs` / `turns`.
    pub fsyncs_per_turn: f64,
    /// The most writes one transaction carried.
    pub largest_group: u64,
}

/// What the cluster's processes sent PostgreSQL and Redis during the run, per turn
/// ([`wire`] says how each is counted).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendFigures {
    /// The processes measured.
    pub processes: u32,
    /// PostgreSQL statements (event store and ledger).
    pub postgres_statements_per_turn: f64,
    /// PostgreSQL statements per turn, by first keyword.
    pub postgres_statements_by_kind_per_turn: BTreeMap<String, f64>,
    /// PostgreSQL round trips.
    pub postgres_round_trips_per_turn: f64,
    /// Round trips that ran nothing: the connection pools' checks of a connection.
    pub postgres_pings_per_turn: f64,
    /// Redis commands.
    pub redis_commands_per_turn: f64,
    /// Redis commands per turn, by name.
    pub redis_commands_by_name_per_turn: BTreeMap<String, f64>,
}

/// Runs the workload and reports.
///
/// # Errors
///
/// When the options are out of range or the services cannot start; invocations that do
/// not complete are reported (`failed`), not errors.
pub async fn run(options: BenchOptions) -> anyhow::Result<Report> {
    options.check()?;
    let dir = match &options.dir {
        Some(parent) => tempfile::tempdir_in(parent),
        None => tempfile::tempdir(),
    }
    .context("cannot create the bench's temporary directory")?;
    let gate = options.park.then(|| Arc::new(Gate::new()));
    let model = Arc::new(BenchModel {
        turns: options.turns,
        gate: gate.clone(),
    });
    let deployment = Deployment::start(dir.path(), &options, model).await?;
    let wire_before = deployment.wire_counts();
    let result = match &gate {
        Some(gate) => park(&deployment, &options, gate).await,
        None => drive(&deployment, &options).await,
    };
    let figures = match result {
        Ok(figures) => figures,
        Err(error) => {
            deployment.stop().await;
            return Err(error);
        }
    };
    let turns = figures.turns.max(1) as f64;
    let spans = deployment.spans();
    let backends = match (deployment.wire_counts(), wire_before) {
        (Some(after), Some(before)) => Some(backend_figures(
            &after.since(&before),
            deployment.pids().len(),
            turns,
        )),
        _ => None,
    };
    let store = deployment.store_figures(turns).await;
    let peak_rss_bytes = deployment.peak_rss();
    deployment.stop().await;
    drop(dir);
    let store = store?;

    Ok(Report {
        mode: options.mode,
        // The cluster's orchestrators always verify a JWT, as the manifests configure.
        auth: options.auth || options.mode == Mode::Cluster,
        policies: options.policies.clone(),
        traces: options.traces,
        spans_per_turn: spans.received as f64 / turns,
        spans_dropped: spans.ended.saturating_sub(spans.received),
        invocations: options.invocations,
        turns_per_invocation: options.turns,
        completed: figures.completed,
        failed: u64::from(options.invocations).saturating_sub(figures.completed),
        first_failure: figures.first_failure,
        turns: figures.turns,
        elapsed_s: figures.elapsed.as_secs_f64(),
        turns_per_s: figures.turns as f64 / figures.elapsed.as_secs_f64().max(1e-9),
        turn_latency_ms: figures.turn_latency.percentiles(),
        invocation_latency_ms: figures.invocation_latency.percentiles(),
        cpu_us_per_turn: figures.cpu.as_secs_f64() * 1e6 / turns,
        peak_rss_bytes,
        store,
        backends,
        park: figures.park,
    })
}

/// The wire's counts of a run, per turn.
fn backend_figures(counts: &wire::WireCounts, processes: usize, turns: f64) -> BackendFigures {
    let per_turn = |by: &BTreeMap<String, u64>| {
        by.iter()
            .map(|(key, n)| (key.clone(), *n as f64 / turns))
            .collect()
    };
    BackendFigures {
        processes: u32::try_from(processes).unwrap_or(u32::MAX),
        postgres_statements_per_turn: counts.statements as f64 / turns,
        postgres_statements_by_kind_per_turn: per_turn(&counts.statements_by_kind),
        postgres_round_trips_per_turn: counts.round_trips as f64 / turns,
        postgres_pings_per_turn: counts.pings as f64 / turns,
        redis_commands_per_turn: counts.commands as f64 / turns,
        redis_commands_by_name_per_turn: per_turn(&counts.commands_by_name),
    }
}

impl Report {
    /// The report as text, one figure per line.
    pub fn text(&self) -> String {
        let mode = match self.mode {
            Mode::Embedded => "embedded (in-process ports and executor)",
            Mode::Distributed => "distributed (five gRPC servers on loopback)",
            Mode::Cluster => "cluster (the production overlay as processes)",
        };
        let auth = if self.auth {
            ", every call authenticated"
        } else {
            ""
        };
        let policies = if self.policies.is_empty() {
            String::new()
        } else {
            let files: Vec<String> = self
                .policies
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            format!(", every call authorized by {}", files.join(", "))
        };
        let traces = if self.traces {
            ", every span exported over OTLP"
        } else {
            ""
        };
        let mut text = format!(
            "agentloop bench, {mode}{auth}{policies}{traces}: {} invocations x {} turns\n\
             completed        {} of {}\n\
             turns            {} in {:.2} s: {:.0} turns/s\n",
            self.invocations,
            self.turns_per_invocation,
            self.completed,
            self.invocations,
            self.turns,
            self.elapsed_s,
            self.turns_per_s,
        );
        if self.park.is_none() {
            text.push_str(&format!(
                "turn latency     p50 {:.2} ms, p99 {:.2} ms (commit to commit)\n\
                 invocation       p50 {:.2} ms, p99 {:.2} ms (start to end)\n",
                self.turn_latency_ms.p50,
                self.turn_latency_ms.p99,
                self.invocation_latency_ms.p50,
                self.invocation_latency_ms.p99,
            ));
        }
        let whose = match &self.backends {
            Some(backends) => format!("{} processes, summed", backends.processes),
            None => "all threads".to_owned(),
        };
        text.push_str(&format!(
            "cpu              {:.1} us per turn ({whose})\n\
             peak RSS         {:.1} MiB\n",
            self.cpu_us_per_turn,
            self.peak_rss_bytes as f64 / (1024.0 * 1024.0),
        ));
        if let Some(store) = &self.store {
            text.push_str(&format!(
                "stored           {:.0} B per turn ({:.0} B of event bodies)\n\
                 fsyncs           {:.4} per turn ({} in all: {} group commits, largest group {})\n",
                store.stored_bytes_per_turn,
                store.event_bytes_per_turn,
                store.fsyncs_per_turn,
                store.fsyncs,
                store.commits,
                store.largest_group,
            ));
        }
        if let Some(backends) = &self.backends {
            let listed = |by: &BTreeMap<String, f64>| {
                let each: Vec<String> = by.iter().map(|(key, n)| format!("{key} {n:.2}")).collect();
                each.join(", ")
            };
            text.push_str(&format!(
                "postgres         {:.2} statements per turn ({})\n\
                 \x20                {:.2} round trips per turn ({:.2} of them pings)\n\
                 redis            {:.2} commands per turn ({})\n",
                backends.postgres_statements_per_turn,
                listed(&backends.postgres_statements_by_kind_per_turn),
                backends.postgres_round_trips_per_turn,
                backends.postgres_pings_per_turn,
                backends.redis_commands_per_turn,
                listed(&backends.redis_commands_by_name_per_turn),
            ));
        }
        if self.traces {
            text.push_str(&format!(
                "spans            {:.1} per turn exported, {} dropped\n",
                self.spans_per_turn, self.spans_dropped
            ));
        }
        if let Some(park) = &self.park {
            text.push_str(&format!(
                "parked           {} at once: {:.0} B each ({:.1} -> {:.1} MiB resident)\n",
                park.parked,
                park.bytes_per_parked_invocation,
                park.rss_before_bytes as f64 / (1024.0 * 1024.0),
                park.rss_parked_bytes as f64 / (1024.0 * 1024.0),
            ));
        }
        if let Some(failure) = &self.first_failure {
            text.push_str(&format!("first failure    {failure}\n"));
        }
        text
    }
}

/// Spans of a traced run.
#[derive(Debug, Default)]
struct Spans {
    ended: u64,
    received: u64,
}

/// What a run measured, before the store's figures are added.
struct Figures {
    completed: u64,
    first_failure: Option<String>,
    turns: u64,
    elapsed: Duration,
    cpu: Duration,
    turn_latency: Histogram,
    invocation_latency: Histogram,
    park: Option<ParkReport>,
}

// ---------------------------------------------------------------------------------------
// The model.

/// Holds first-turn decisions until released, counting the ones waiting.
#[derive(Debug)]
struct Gate {
    waiting: watch::Sender<u64>,
    released: watch::Sender<bool>,
}

impl Gate {
    fn new() -> Gate {
        Gate {
            waiting: watch::Sender::new(0),
            released: watch::Sender::new(false),
        }
    }

    async fn pass(&self) {
        let mut released = self.released.subscribe();
        self.waiting.send_modify(|n| *n += 1);
        // An error means the gate is gone, which only happens at shutdown.
        let _ = released.wait_for(|open| *open).await;
    }
}

/// The standard workload's model: two lookups per turn, then an answer from the results.
#[derive(Debug)]
struct BenchModel {
    turns: u32,
    gate: Option<Arc<Gate>>,
}

/// The keys turn `turn` looks up: the next two, so consecutive plans always differ.
fn keys_of(turn: u32) -> [(&'static str, &'static str); 2] {
    let first = (turn as usize * 2) % KEYS.len();
    [KEYS[first], KEYS[(first + 1) % KEYS.len()]]
}

/// The calls of turn `turn` (before the last): call IDs unique per turn, and the keys.
fn calls_of(turn: u32) -> [(String, &'static str); 2] {
    let [(first, _), (second, _)] = keys_of(turn);
    [
        (format!("call-{turn}-a"), first),
        (format!("call-{turn}-b"), second),
    ]
}

/// The calls the answer of an invocation of `turns` turns cites: its last lookups.
fn evidence_of(turns: u32) -> Vec<String> {
    match turns {
        0 | 1 => Vec::new(),
        _ => calls_of(turns - 1).into_iter().map(|(id, _)| id).collect(),
    }
}

/// The workload's decisions as a scripted model (the format of `docs/models.md`), for
/// a decision service in a process of its own.
fn script(turns: u32) -> String {
    let mut decisions: Vec<serde_json::Value> = (1..turns)
        .map(|turn| {
            let calls: Vec<_> = calls_of(turn)
                .into_iter()
                .map(|(id, key)| {
                    serde_json::json!({"id": id, "name": LOOKUP, "arguments": {"key": key}})
                })
                .collect();
            serde_json::json!({ "tool_calls": calls })
        })
        .collect();
    decisions.push(serde_json::json!({
        "final": expected_answer(turns),
        "evidence": evidence_of(turns),
    }));
    serde_json::json!({ "turns": decisions }).to_string()
}

/// The answer of an invocation of `turns` turns: what its last lookups returned.
fn expected_answer(turns: u32) -> String {
    match turns {
        0 | 1 => "nothing was looked up".to_owned(),
        _ => keys_of(turns - 1)
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

#[derive(serde::Deserialize)]
struct LookupOutput {
    key: String,
    value: String,
}

/// "key=value; key=value" from the results of the newest turn in the history.
fn answer_from(history: &[pb::Event]) -> String {
    use pb::tool_result::Outcome;
    let last = history.iter().rev().find_map(|event| match &event.body {
        Some(pb::event::Body::Turn(turn)) if !turn.results.is_empty() => Some(turn),
        Some(_) | None => None,
    });
    let Some(turn) = last else {
        return expected_answer(1);
    };
    turn.results
        .iter()
        .map(|result| match &result.outcome {
            Some(Outcome::Output(output)) => {
                match serde_json::from_str::<LookupOutput>(&output.output_json) {
                    Ok(found) => format!("{}={}", found.key, found.value),
                    Err(_) => format!("{}=?", result.call_id),
                }
            }
            Some(_) | None => format!("{}=failed", result.call_id),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[async_trait::async_trait]
impl Model for BenchModel {
    /// The last turn, whose results the answer names.
    fn reads_history(&self) -> usize {
        1
    }

    fn provider(&self) -> &'static str {
        "bench"
    }

    fn request_model(&self) -> &str {
        "bench"
    }

    async fn decide_with(
        &self,
        request: &pb::DecideRequest,
        _tools: &[pb::ToolDescriptor],
    ) -> Result<ModelReply, ModelError> {
        use pb::decision::{Final, Kind, ToolCalls};
        if request.turn == 1
            && let Some(gate) = &self.gate
        {
            gate.pass().await;
        }
        let kind = if request.turn < self.turns {
            let calls = calls_of(request.turn)
                .into_iter()
                .map(|(call_id, key)| pb::ToolCall {
                    call_id,
                    tool: LOOKUP.to_owned(),
                    arguments_json: format!(r#"{{"key":"{key}"}}"#),
                })
                .collect();
            Kind::ToolCalls(ToolCalls { calls })
        } else {
            // Citing the last turn's lookups (if any), which the acceptance rules check.
            Kind::Final(Final {
                answer: answer_from(&request.history),
                evidence: evidence_of(request.turn),
            })
        };
        Ok(ModelReply {
            outcome: pb::decide_response::Outcome::Decision(pb::Decision { kind: Some(kind) }),
            usage: pb::Usage::default(),
            model: "bench".to_owned(),
            response_id: String::new(),
        })
    }
}

// ---------------------------------------------------------------------------------------
// The deployment.

/// How the bench reaches the orchestrator.
#[derive(Clone)]
enum Client {
    /// The API in this process, and the `authorization` each call carries, if any.
    InProcess(Api, Option<MetadataValue<Ascii>>),
    Grpc(OrchestratorServiceClient<Transport>),
}

impl Client {
    /// `message` as a call of the in-process API, with the token.
    fn request<T>(message: T, authorization: Option<&MetadataValue<Ascii>>) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(value) = authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        request
    }
}

type Events = BoxStream<'static, Result<pb::WatchInvocationResponse, tonic::Status>>;

impl Client {
    async fn start(&self, request: pb::StartInvocationRequest) -> Result<String, tonic::Status> {
        let response = match self {
            Client::InProcess(api, authorization) => {
                api.start_invocation(Client::request(request, authorization.as_ref()))
                    .await?
            }
            Client::Grpc(client) => client.clone().start_invocation(request).await?,
        };
        response
            .into_inner()
            .invocation
            .map(|invocation| invocation.invocation_id)
            .ok_or_else(|| tonic::Status::internal("the start response names no invocation"))
    }

    async fn watch(&self, invocation_id: String) -> Result<Events, tonic::Status> {
        let request = pb::WatchInvocationRequest {
            invocation_id,
            from_seq: 1,
        };
        Ok(match self {
            Client::InProcess(api, authorization) => api
                .watch_invocation(Client::request(request, authorization.as_ref()))
                .await?
                .into_inner(),
            Client::Grpc(client) => client
                .clone()
                .watch_invocation(request)
                .await?
                .into_inner()
                .boxed(),
        })
    }
}

struct Deployment {
    /// Where invocations start, in turn: one client, or one per orchestrator.
    clients: Vec<Client>,
    /// What every start request asks for.
    start: pb::StartInvocationRequest,
    backend: Backend,
}

enum Backend {
    /// Every service in this process.
    InProcess {
        stack: Stack,
        /// With `--traces`: the receiver, and every service's telemetry.
        traced: Option<(OtlpReceiver, Vec<Telemetry>)>,
    },
    /// The local cluster's processes.
    Cluster(ClusterBackend),
}

/// The cluster and what it runs on; the fields drop in order, so the processes stop
/// before the proxies and the databases go.
struct ClusterBackend {
    cluster: LocalCluster,
    postgres: CountingProxy,
    redis: CountingProxy,
    databases: [Database; 2],
}

/// The prefix of the bench's databases.
const DATABASE_PREFIX: &str = "agentloop_bench_";

impl Deployment {
    async fn start(
        dir: &Path,
        options: &BenchOptions,
        model: Arc<BenchModel>,
    ) -> anyhow::Result<Deployment> {
        let data_file = dir.join("lookup.json");
        let table: BTreeMap<_, _> = KEYS.into_iter().collect();
        std::fs::write(&data_file, serde_json::to_vec(&table)?)?;
        match options.mode {
            Mode::Embedded => {
                Deployment::in_process(dir, options, model, &data_file, Wiring::Embedded).await
            }
            Mode::Distributed => {
                Deployment::in_process(dir, options, model, &data_file, Wiring::Distributed).await
            }
            Mode::Cluster => Deployment::cluster(dir, options, &data_file).await,
        }
    }

    async fn in_process(
        dir: &Path,
        options: &BenchOptions,
        model: Arc<BenchModel>,
        data_file: &Path,
        wiring: Wiring,
    ) -> anyhow::Result<Deployment> {
        let mut services = ServicesOptions::new(dir.to_path_buf());
        services.demo.data_file = Some(data_file.to_path_buf());
        // Every invocation's two lookups may be in flight at once.
        services.gateway.max_concurrent_calls_per_executor =
            (2 * options.invocations as usize).max(64);
        // The workload only reads, so the ledger is never written; it is wired all the
        // same, as in every deployment.
        services.model = Some(model);
        if !options.policies.is_empty() {
            services.policy.policies = std::collections::BTreeMap::from([(
                "default".to_owned(),
                options.policies.clone(),
            )]);
        }
        let mut orchestrator = orchestrator_config(options);
        let token = if options.auth {
            let secret_file = dir.join("jwt-secret");
            let secret = hex_secret();
            std::fs::write(&secret_file, &secret)?;
            orchestrator.server.auth = AuthConfig {
                mode: AuthMode::Jwt,
                hs256_secret_file: Some(secret_file),
                issuer: Some(ISSUER.to_owned()),
                audience: Some(AUDIENCE.to_owned()),
                ..AuthConfig::default()
            };
            let token = DevToken {
                issuer: ISSUER.to_owned(),
                audience: AUDIENCE.to_owned(),
                actor: "bench".to_owned(),
                tenant: "bench".to_owned(),
                roles: Vec::new(),
                valid_for_s: 24 * 3600,
            };
            Some(agentloop_auth::mint_hs256(&secret, &token)?)
        } else {
            None
        };
        let (telemetry, traced) = if options.traces {
            let receiver = OtlpReceiver::counting().await?;
            let of = |service: &str| receiver.telemetry(service, Metrics::new(), std::env::vars());
            let orchestrator = of("agentloop-orchestrator")?;
            services.telemetry = ServiceTelemetry {
                decision: of("agentloop-decision")?,
                policy: of("agentloop-policy")?,
                tools: of("agentloop-tools")?,
                ledger: of("agentloop-ledger")?,
                demo_executor: of("agentloop-demo-executor")?,
            };
            let t = &services.telemetry;
            let every = vec![
                orchestrator.clone(),
                t.decision.clone(),
                t.policy.clone(),
                t.tools.clone(),
                t.ledger.clone(),
                t.demo_executor.clone(),
            ];
            (orchestrator, Some((receiver, every)))
        } else {
            let off = Telemetry::off();
            services.telemetry = ServiceTelemetry::shared(&off);
            (off, None)
        };
        let stack = Stack::start(StackOptions {
            wiring,
            orchestrator,
            services,
            telemetry,
            ..StackOptions::embedded(dir.to_path_buf())
        })
        .await?;
        let client = match wiring {
            Wiring::Embedded => {
                let authorization = token
                    .map(|token| format!("Bearer {token}").parse())
                    .transpose()?;
                Client::InProcess(stack.api().clone(), authorization)
            }
            Wiring::Distributed => Client::Grpc(agentloop_proto::client::orchestrator(
                agentloop_stack::channel_as(&stack.endpoint(), token.as_deref()).await?,
            )),
        };
        Ok(Deployment {
            clients: vec![client],
            start: start_request(),
            backend: Backend::InProcess { stack, traced },
        })
    }

    /// Two databases and two counting proxies, then the cluster over them.
    async fn cluster(
        dir: &Path,
        options: &BenchOptions,
        data_file: &Path,
    ) -> anyhow::Result<Deployment> {
        let settings = &options.cluster;
        let postgres_upstream = wire::upstream(&settings.postgres_url, Protocol::Postgres)?;
        let redis_upstream = wire::upstream(&settings.redis_url, Protocol::Redis)?;
        let create = || async {
            Database::create(&settings.postgres_url, DATABASE_PREFIX)
                .await
                .with_context(|| {
                    format!(
                        "cannot create a database on {}",
                        databases::redact(&settings.postgres_url)
                    )
                })
        };
        let databases = [create().await?, create().await?];
        let postgres = CountingProxy::start(Protocol::Postgres, postgres_upstream).await?;
        let redis = CountingProxy::start(Protocol::Redis, redis_upstream).await?;
        let cluster = LocalCluster::up(&ClusterOptions {
            script: settings.script.clone(),
            bin_dir: settings.bin_dir.clone(),
            parent_dir: Some(dir.to_path_buf()),
            database_url: wire::through(databases[0].url(), postgres.address())?,
            ledger_database_url: wire::through(databases[1].url(), postgres.address())?,
            redis_url: wire::through(&settings.redis_url, redis.address())?,
            env: vec![format!(
                "AGENTLOOP_DEMO_EXECUTOR_DATA_FILE={}",
                data_file.display()
            )],
        })
        .await?;
        let mut clients = Vec::with_capacity(2);
        for endpoint in cluster.orchestrators()? {
            clients.push(Client::Grpc(cluster.client(endpoint).await?));
        }
        let tool_calls = 2 * options.turns.saturating_sub(1);
        Ok(Deployment {
            clients,
            start: pb::StartInvocationRequest {
                scripted_model_json: script(options.turns),
                budget_overrides: Some(pb::BudgetOverrides {
                    max_steps: Some(options.turns),
                    max_tool_calls: Some(tool_calls),
                    ..pb::BudgetOverrides::default()
                }),
                ..start_request()
            },
            backend: Backend::Cluster(ClusterBackend {
                cluster,
                postgres,
                redis,
                databases,
            }),
        })
    }

    /// The in-process services (park mode needs them).
    fn stack(&self) -> anyhow::Result<&Stack> {
        match &self.backend {
            Backend::InProcess { stack, .. } => Ok(stack),
            Backend::Cluster(_) => bail!("the cluster's services are not in this process"),
        }
    }

    /// With `--traces`, waits until every service has exported what it buffers.
    async fn flush_spans(&self) {
        if let Backend::InProcess {
            traced: Some((_, every)),
            ..
        } = &self.backend
        {
            for telemetry in every {
                telemetry.flush().await;
            }
        }
    }

    /// With `--traces`, the spans the services ended and those the receiver got.
    fn spans(&self) -> Spans {
        let Backend::InProcess {
            traced: Some((receiver, every)),
            ..
        } = &self.backend
        else {
            return Spans::default();
        };
        let ended = every
            .iter()
            .filter_map(|telemetry| {
                metrics::sample(&telemetry.metrics().encode(), "agentloop_spans_ended_total")
            })
            .sum::<f64>();
        Spans {
            // A count, exact below 2^53.
            ended: ended as u64,
            received: receiver.count(),
        }
    }

    /// The processes whose CPU and memory are measured: none but this one in-process.
    fn pids(&self) -> Vec<String> {
        match &self.backend {
            Backend::InProcess { .. } => vec!["self".to_owned()],
            Backend::Cluster(backend) => backend
                .cluster
                .pids()
                .values()
                .map(u32::to_string)
                .collect(),
        }
    }

    /// User + system CPU time of the measured processes so far.
    fn cpu_time(&self) -> anyhow::Result<Duration> {
        self.pids().iter().map(|pid| cpu_time(pid)).sum()
    }

    /// The measured processes' peak resident sets, summed.
    fn peak_rss(&self) -> u64 {
        self.pids()
            .iter()
            .filter_map(|pid| process_status(pid, "VmHWM:"))
            .sum()
    }

    /// What the cluster's processes sent PostgreSQL and Redis so far.
    fn wire_counts(&self) -> Option<wire::WireCounts> {
        let Backend::Cluster(backend) = &self.backend else {
            return None;
        };
        Some(wire::WireCounts::join(
            backend.postgres.counts(),
            backend.redis.counts(),
        ))
    }

    /// The SQLite store's figures, per turn.
    async fn store_figures(&self, turns: f64) -> anyhow::Result<Option<StoreFigures>> {
        let Backend::InProcess { stack, .. } = &self.backend else {
            return Ok(None);
        };
        let storage = stack.store().storage().await?;
        let stats = stack.store().stats();
        let fsyncs = stats.commits + 2 * stats.checkpoints;
        Ok(Some(StoreFigures {
            stored_bytes_per_turn: storage.used_bytes as f64 / turns,
            event_bytes_per_turn: storage.event_body_bytes as f64 / turns,
            fsyncs,
            commits: stats.commits,
            fsyncs_per_turn: fsyncs as f64 / turns,
            largest_group: stats.largest_group,
        }))
    }

    /// Drains the orchestrators and stops the services; a cluster's databases go too.
    async fn stop(self) {
        match self.backend {
            Backend::InProcess { stack, .. } => {
                if let Err(error) = stack.stop().await {
                    tracing::warn!(%error, "a bench server failed");
                }
            }
            Backend::Cluster(backend) => {
                let ClusterBackend {
                    cluster,
                    postgres,
                    redis,
                    databases,
                } = backend;
                if let Err(error) = cluster.down().await {
                    tracing::warn!(%error, "the cluster did not stop cleanly");
                }
                drop((postgres, redis));
                for database in databases {
                    if let Err(error) = database.drop_database().await {
                        tracing::warn!(%error, "a bench database was not dropped");
                    }
                }
            }
        }
    }
}

/// The issuer and audience of the bench's tokens.
const ISSUER: &str = "https://agentloop-bench.invalid";
const AUDIENCE: &str = "agentloop";

/// A fresh 256-bit HS256 secret, as hex.
fn hex_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The orchestrator's configuration for the workload: budgets that fit T turns exactly,
/// and room for N invocations at once.
fn orchestrator_config(options: &BenchOptions) -> OrchestratorConfig {
    let mut config = OrchestratorConfig::default();
    let tool_calls = 2 * options.turns.saturating_sub(1);
    config.limits.max_steps = options.turns;
    config.limits.max_tool_calls = tool_calls;
    config.bounds.max_steps_cap = config.bounds.max_steps_cap.max(options.turns);
    config.bounds.max_tool_calls_cap = config.bounds.max_tool_calls_cap.max(tool_calls);
    config.bounds.max_running = config.bounds.max_running.max(options.invocations as usize);
    config
}

fn start_request() -> pb::StartInvocationRequest {
    pb::StartInvocationRequest {
        goal: "Look up the customer's records, two at a time, and summarise the last two."
            .to_owned(),
        allowed_tools: vec![LOOKUP.to_owned()],
        ..pb::StartInvocationRequest::default()
    }
}

// ---------------------------------------------------------------------------------------
// Driving.

/// What one invocation showed its watcher.
struct Observed {
    turns: u64,
    /// Commit-to-commit gaps, in microseconds.
    gaps: Vec<u64>,
    total: Duration,
    failure: Option<String>,
}

/// Starts one invocation, follows it to its end and checks it: its answer, and what
/// its last lookups returned (which the answer must have been built from).
async fn follow(client: Client, start: pb::StartInvocationRequest, turns: u32) -> Observed {
    let started = Instant::now();
    let mut observed = Observed {
        turns: 0,
        gaps: Vec::with_capacity(turns as usize),
        total: Duration::ZERO,
        failure: None,
    };
    let stream = match client.start(start).await {
        Ok(id) => client.watch(id).await,
        Err(status) => Err(status),
    };
    let mut stream = match stream {
        Ok(stream) => stream,
        Err(status) => {
            observed.failure = Some(format!("start or watch failed: {status}"));
            return observed;
        }
    };
    let mut last: Option<Duration> = None;
    let mut lookups: Option<pb::Event> = None;
    let mut end = None;
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(response) => response.event,
            Err(status) => {
                observed.failure = Some(format!("watch failed: {status}"));
                return observed;
            }
        };
        let Some(event) = event else { continue };
        // The last turn commits its `Turn` and the `Ended` event together.
        match event.body {
            Some(pb::event::Body::Turn(ref turn)) => {
                observed.turns += 1;
                let committed = event.committed_at.map_or(Duration::ZERO, |at| {
                    Duration::new(
                        u64::try_from(at.seconds).unwrap_or(0),
                        u32::try_from(at.nanos).unwrap_or(0),
                    )
                });
                if let Some(previous) = last {
                    let gap = committed.saturating_sub(previous).as_micros();
                    observed.gaps.push(u64::try_from(gap).unwrap_or(u64::MAX));
                }
                last = Some(committed);
                if !turn.results.is_empty() {
                    lookups = Some(event);
                }
            }
            Some(pb::event::Body::Ended(ended)) => {
                end = Some(ended);
                break;
            }
            Some(_) | None => {}
        }
    }
    observed.total = started.elapsed();
    let expected = expected_answer(turns);
    let looked_up = answer_from(lookups.as_slice());
    observed.failure = match end {
        None => Some("the watch ended before the invocation did".to_owned()),
        Some(ended) if ended.reason() != pb::TerminalReason::Completed => {
            Some(format!("ended {:?}: {}", ended.reason(), ended.detail))
        }
        Some(ended) if ended.answer.as_deref() != Some(expected.as_str()) => {
            Some(format!("answer {:?}, expected {expected:?}", ended.answer))
        }
        Some(_) if looked_up != expected => Some(format!(
            "the last lookups returned {looked_up:?}, expected {expected:?}"
        )),
        Some(_) if observed.turns != u64::from(turns) => Some(format!(
            "{} turns committed, expected {turns}",
            observed.turns
        )),
        Some(_) => None,
    };
    observed
}

async fn drive(deployment: &Deployment, options: &BenchOptions) -> anyhow::Result<Figures> {
    let cpu_before = deployment.cpu_time()?;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for (_, client) in (0..options.invocations).zip(deployment.clients.iter().cycle()) {
        tasks.spawn(follow(
            client.clone(),
            deployment.start.clone(),
            options.turns,
        ));
    }
    let mut figures = Figures {
        completed: 0,
        first_failure: None,
        turns: 0,
        elapsed: Duration::ZERO,
        cpu: Duration::ZERO,
        turn_latency: Histogram::default(),
        invocation_latency: Histogram::default(),
        park: None,
    };
    let collect = async {
        while let Some(joined) = tasks.join_next().await {
            let observed = joined.context("an invocation's driver panicked")?;
            figures.turns += observed.turns;
            for gap in &observed.gaps {
                figures.turn_latency.record(*gap);
            }
            figures
                .invocation_latency
                .record(u64::try_from(observed.total.as_micros()).unwrap_or(u64::MAX));
            match observed.failure {
                None => figures.completed += 1,
                Some(failure) => {
                    figures.first_failure.get_or_insert(failure);
                }
            }
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(RUN_TIMEOUT, collect)
        .await
        .context("the run took longer than an hour")??;
    deployment.flush_spans().await;
    figures.elapsed = started.elapsed();
    figures.cpu = deployment.cpu_time()?.saturating_sub(cpu_before);
    Ok(figures)
}

/// Park mode: start all, wait until all wait, measure, release, wait for the end.
async fn park(
    deployment: &Deployment,
    options: &BenchOptions,
    gate: &Gate,
) -> anyhow::Result<Figures> {
    let total = u64::from(options.invocations);
    let stack = deployment.stack()?;
    let rss_before = process_status("self", "VmRSS:").context("cannot read VmRSS")?;
    let cpu_before = deployment.cpu_time()?;
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut starters = JoinSet::new();
    for _ in 0..PARK_STARTERS {
        let (client, next) = (deployment.clients[0].clone(), Arc::clone(&next));
        let start = deployment.start.clone();
        starters.spawn(async move {
            while next.fetch_add(1, Relaxed) < total {
                client.start(start.clone()).await?;
            }
            Ok::<(), tonic::Status>(())
        });
    }
    while let Some(joined) = starters.join_next().await {
        joined.context("a starter panicked")??;
    }
    let mut waiting = gate.waiting.subscribe();
    tokio::time::timeout(RUN_TIMEOUT, waiting.wait_for(|n| *n >= total))
        .await
        .context("the invocations did not all park within an hour")??;
    let rss_parked = process_status("self", "VmRSS:").context("cannot read VmRSS")?;
    gate.released.send_replace(true);

    // T turns, the last one committed with the `Ended` event.
    let expected_events = total * (u64::from(options.turns) + 1);
    let finished = async {
        loop {
            let stats = stack.store().stats();
            if stack.store().running(None, 1).await?.is_empty() {
                return anyhow::Ok(stats);
            }
            tokio::time::sleep(PARK_POLL).await;
        }
    };
    tokio::time::timeout(RUN_TIMEOUT, finished)
        .await
        .context("the released invocations did not end within an hour")??;
    deployment.flush_spans().await;
    let elapsed = started.elapsed();
    let storage = stack.store().storage().await?;
    // Each invocation commits at most T + 1 events (its step budget is T); all of them
    // means every invocation got to its answer.
    let complete = storage.events == expected_events;
    Ok(Figures {
        completed: if complete { total } else { 0 },
        first_failure: (!complete).then(|| {
            format!(
                "{} events committed, expected {expected_events}",
                storage.events
            )
        }),
        turns: storage.events.saturating_sub(total),
        elapsed,
        cpu: deployment.cpu_time()?.saturating_sub(cpu_before),
        turn_latency: Histogram::default(),
        invocation_latency: Histogram::default(),
        park: Some(ParkReport {
            parked: total,
            rss_before_bytes: rss_before,
            rss_parked_bytes: rss_parked,
            bytes_per_parked_invocation: rss_parked.saturating_sub(rss_before) as f64
                / total as f64,
        }),
    })
}

// ---------------------------------------------------------------------------------------
// Measuring.

/// Latencies in microseconds in log-linear buckets: exact below 64 µs, then 32 buckets
/// per power of two (at most 3% off), so its size is fixed whatever the sample count.
#[derive(Debug, Clone)]
struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

const SUB_BITS: u32 = 5;
const LINEAR: u64 = 2 << SUB_BITS;
const BUCKETS: usize = LINEAR as usize + (64 - SUB_BITS as usize - 1) * (1 << SUB_BITS);

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
        }
    }
}

impl Histogram {
    fn bucket(value: u64) -> usize {
        if value < LINEAR {
            return value as usize;
        }
        let exponent = 63 - value.leading_zeros();
        let mantissa = (value >> (exponent - SUB_BITS)) - (1 << SUB_BITS);
        LINEAR as usize + ((exponent - SUB_BITS - 1) as usize) * (1 << SUB_BITS) + mantissa as usize
    }

    /// The smallest value of a bucket.
    fn lowest(bucket: usize) -> u64 {
        let bucket = bucket as u64;
        if bucket < LINEAR {
            return bucket;
        }
        let offset = bucket - LINEAR;
        let exponent = offset / (1 << SUB_BITS) + u64::from(SUB_BITS) + 1;
        let mantissa = offset % (1 << SUB_BITS) + (1 << SUB_BITS);
        mantissa << (exponent - u64::from(SUB_BITS))
    }

    fn record(&mut self, value: u64) {
        if let Some(count) = self.counts.get_mut(Histogram::bucket(value)) {
            *count += 1;
            self.total += 1;
        }
    }

    /// The value at quantile `q` (0..=1), in microseconds; 0 when empty.
    fn quantile(&self, q: f64) -> u64 {
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total.max(1));
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank && *count > 0 {
                return Histogram::lowest(bucket);
            }
        }
        0
    }

    fn percentiles(&self) -> Percentiles {
        Percentiles {
            p50: self.quantile(0.50) as f64 / 1000.0,
            p99: self.quantile(0.99) as f64 / 1000.0,
        }
    }
}

/// A `kB` line of `/proc/PID/status` (`pid` may be `self`), in bytes.
fn process_status(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    let kib: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// User + system CPU time of a process so far (`/proc/PID/stat`, `pid` may be `self`;
/// in USER_HZ = 100 ticks per second on Linux).
fn cpu_time(pid: &str) -> anyhow::Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("{path} has no command name"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |index: usize| -> anyhow::Result<u64> {
        let field = fields
            .get(index)
            .with_context(|| format!("{path} is too short"))?;
        Ok(field.parse()?)
    };
    // utime and stime are fields 14 and 15 of the line; 12 and 13 after the name.
    let ticks = tick(11)? + tick(12)?;
    Ok(Duration::from_millis(ticks * 10))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn histogram_buckets_round_trip_within_three_percent() {
        for value in [
            0,
            1,
            63,
            64,
            65,
            100,
            1_000,
            12_345,
            1_000_000,
            u64::MAX / 2,
        ] {
            let lowest = Histogram::lowest(Histogram::bucket(value));
            assert!(lowest <= value, "{value}: {lowest}");
            assert!(
                (value - lowest) as f64 <= value as f64 * 0.032,
                "{value}: {lowest}"
            );
        }
        assert!(Histogram::bucket(u64::MAX) < BUCKETS);
        let mut histogram = Histogram::default();
        for value in 1..=1_000 {
            histogram.record(value);
        }
        assert_eq!(histogram.quantile(0.5), 496);
        assert!(histogram.quantile(0.99) >= 960 && histogram.quantile(0.99) <= 990);
        assert_eq!(Histogram::default().quantile(0.5), 0);
    }

    /// A committed turn whose lookups returned what the demo executor's table holds.
    fn looked_up(turn: u32) -> pb::Event {
        let results = calls_of(turn)
            .into_iter()
            .map(|(call_id, key)| {
                let value = KEYS
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| *v)
                    .unwrap();
                pb::ToolResult {
                    call_id,
                    outcome: Some(pb::tool_result::Outcome::Output(pb::ToolOutput {
                        output_json: serde_json::json!({"key": key, "value": value}).to_string(),
                        ..Default::default()
                    })),
                }
            })
            .collect();
        pb::Event {
            body: Some(pb::event::Body::Turn(pb::TurnCommitted {
                turn,
                results,
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    /// The cluster's scripted model and the in-process bench model are one workload.
    #[tokio::test]
    async fn the_script_decides_what_the_bench_model_decides_turn_by_turn() {
        for turns in [1, 2, 5] {
            let script = agentloop_decision::ScriptedModel::parse(&script(turns)).unwrap();
            let bench = BenchModel { turns, gate: None };
            for turn in 1..=turns {
                let request = pb::DecideRequest {
                    invocation_id: "i".to_owned(),
                    turn,
                    history: (1..turn).map(looked_up).collect(),
                    ..Default::default()
                };
                let scripted = script.decide_with(&request, &[]).await.unwrap().outcome;
                let modelled = bench.decide_with(&request, &[]).await.unwrap().outcome;
                assert_eq!(scripted, modelled, "turn {turn} of {turns}");
            }
        }
    }

    #[test]
    fn each_turn_looks_up_other_keys_and_the_answer_names_the_last_two() {
        for turn in 1..20 {
            assert_ne!(keys_of(turn), keys_of(turn + 1));
        }
        assert_eq!(expected_answer(10), "orders=3 open; invoices=2 unpaid");
        assert_eq!(expected_answer(1), "nothing was looked up");
    }
}
