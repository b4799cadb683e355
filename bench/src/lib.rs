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
//! wired but never written. In both, the orchestrator also serves its HTTP/JSON API, as
//! `agentloop dev` does; nothing calls it. `cluster`: the production overlay as processes
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
mod deployment;
mod drive;
mod measure;
mod model;
pub mod wire;

pub use measure::cpu_time;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::{
    deployment::Deployment,
    drive::{drive, park},
    measure::Histogram,
    model::{BenchModel, Gate},
};
use anyhow::{Context, bail};
use serde::Serialize;

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

#[cfg(test)]
mod tests {

    use agentloop_decision::Model;
    use agentloop_proto::v1 as pb;

    use super::*;
    use crate::measure::BUCKETS;
    use crate::model::{calls_of, expected_answer, keys_of, script};

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
                let scripted = script.decide(&request).await.unwrap().proposal;
                let modelled = bench.decide(&request).await.unwrap().proposal;
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
