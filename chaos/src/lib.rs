//! The fault harness behind `agentloop chaos`: the production overlay as processes
//! (`deploy/local/cluster`), each on a host of its own, with PostgreSQL and Redis on two
//! more; a seeded schedule of partitions and other faults while a workload of reads and
//! writes runs; then, once every fault has healed, a checker of every promise:
//!
//! - every write is applied at most once, and exactly once for a completed invocation
//!   (the executor's own record, against the ledger);
//! - no event is committed under a lease epoch older than the last claim (the log's
//!   fencing trail);
//! - every invocation ends once the faults heal, and how long that took;
//! - no effect of an ended invocation is left unresolved but for
//!   `reconciliation_required`.
//!
//! It needs root (network namespaces, iptables), iproute2, iptables, PostgreSQL's server
//! and `redis-server`. The hosts live in `net`, the faults in `fault`, the schedule in
//! `schedule`, the workload in `workload` and the checker, which is pure, in `check`.

pub mod check;
mod delay;
pub mod fault;
pub mod net;
pub mod network_policy;
pub mod schedule;
pub mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentloop_bench::cluster::{ClusterOptions, LocalCluster};
use agentloop_store::testing::HostedPostgres;
use agentloop_store::{PgOptions, PgStore};
use anyhow::Context;
use serde::Serialize;
use tokio::time::Instant;

use crate::check::{Applied, Observed, TrailStep, Verdict};
use crate::net::Network;
use crate::schedule::{ORCHESTRATORS, SERVICES, Step};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Invocations of the workload, started evenly from the first fault to the last.
    pub invocations: usize,
    /// The schedule's seed.
    pub seed: u64,
    /// Rounds of every kind of fault.
    pub rounds: u32,
    /// The orchestrators' lease time-to-live.
    pub lease: Duration,
    /// How long every invocation may take to end once the faults have healed.
    pub recovery_bound: Duration,
    /// `deploy/local/cluster`.
    pub script: PathBuf,
    /// The folder of the service binaries.
    pub bin_dir: PathBuf,
}

/// What a run did and what the checker found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The seed: the same one gives the same schedule.
    pub seed: u64,
    /// The faults, as scheduled.
    pub schedule: Vec<Step>,
    /// Invocations started.
    pub started: usize,
    /// Why the others were not.
    pub not_started: Vec<String>,
    /// Turns committed, in all.
    pub turns: u64,
    /// From the first start until every invocation ended.
    pub elapsed_ms: u64,
    /// Turns committed per second over [`Report::elapsed_ms`].
    pub turns_per_second: f64,
    /// From the last heal (or the last start, if later) until every invocation ended;
    /// `None` when some never did within the bound.
    pub recovered_ms: Option<u64>,
    /// The manifests' NetworkPolicies, enforced on the hosts, probed against the call
    /// graph they are meant to allow.
    pub network_policy: network_policy::Probed,
    /// The checker's findings.
    pub verdict: Verdict,
}

impl Report {
    /// Whether every promise held and every invocation was started.
    pub fn holds(&self) -> bool {
        self.verdict.holds()
            && self.not_started.is_empty()
            && self.network_policy.disagreements.is_empty()
    }

    /// The report for a person: the schedule, the figures, then each broken promise.
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "seed            {}", self.seed);
        for step in &self.schedule {
            let _ = writeln!(
                out,
                "fault           at {:>6} ms for {:>5} ms: {}",
                step.at_ms, step.hold_ms, step.fault
            );
        }
        let verdict = &self.verdict;
        let reasons: Vec<String> = verdict
            .reasons
            .iter()
            .map(|(reason, count)| format!("{reason} {count}"))
            .collect();
        let _ = writeln!(
            out,
            "invocations     {} started, {} not; {}",
            self.started,
            self.not_started.len(),
            reasons.join(", ")
        );
        let _ = writeln!(
            out,
            "writes          {} applied, {} duplicate, {} lost, {} contradicted",
            verdict.writes_applied,
            verdict.duplicate_writes.len(),
            verdict.lost_writes.len(),
            verdict.contradicted_writes.len()
        );
        let _ = writeln!(
            out,
            "leases          {} takeovers, {} stale commits",
            verdict.takeovers,
            verdict.stale_commits.len()
        );
        let _ = writeln!(
            out,
            "effects         {} left unresolved",
            verdict.unresolved_effects.len()
        );
        let _ = writeln!(
            out,
            "throughput      {} turns in {} ms: {:.0} turns/s",
            self.turns, self.elapsed_ms, self.turns_per_second
        );
        match self.recovered_ms {
            Some(ms) => {
                let _ = writeln!(out, "recovered       {ms} ms after the last fault healed");
            }
            None => {
                let _ = writeln!(
                    out,
                    "recovered       no: {} invocations never ended",
                    verdict.unfinished.len()
                );
            }
        }
        let probed = &self.network_policy;
        let _ = writeln!(
            out,
            "network policy  {} connections tried, {} blocked, {} against the intent",
            probed.probes,
            probed.blocked,
            probed.disagreements.len()
        );
        for disagreement in &probed.disagreements {
            let _ = writeln!(out, "FAILED          network policy: {disagreement}");
        }
        for why in self.not_started.iter().take(5) {
            let _ = writeln!(out, "not started     {why}");
        }
        for failure in verdict.failures(5) {
            let _ = writeln!(out, "FAILED          {failure}");
        }
        let _ = writeln!(
            out,
            "verdict         {}",
            if self.holds() {
                "every promise held"
            } else {
                "BROKEN"
            }
        );
        out
    }
}

/// Why the harness cannot run on this machine, if it cannot: it needs root (network
/// namespaces and packet filters), iproute2, iptables and `redis-server` (PostgreSQL's
/// server is looked for when it starts).
pub fn unavailable() -> Option<String> {
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    if !root {
        return Some("it needs root, for network namespaces and packet filters".into());
    }
    for (program, package) in [
        ("ip", "iproute2"),
        ("iptables", "iptables"),
        ("redis-server", "redis-server"),
    ] {
        let found = std::process::Command::new(program)
            .arg(if program == "ip" { "-V" } else { "--version" })
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !found {
            return Some(format!("{program} is missing (Debian's {package} package)"));
        }
    }
    None
}

/// For a test of the harness: whether it can run here. When it cannot, says why on stderr
/// and returns `false` (the test skips), unless `AGENTLOOP_REQUIRE_NETNS=1`, as CI sets,
/// which turns the skip into a failure.
///
/// # Panics
///
/// When the harness cannot run here and `AGENTLOOP_REQUIRE_NETNS=1`.
#[expect(
    clippy::panic,
    reason = "a required harness that cannot run fails its test"
)]
pub fn runs_here(test: &str) -> bool {
    let Some(why) = unavailable() else {
        return true;
    };
    if std::env::var("AGENTLOOP_REQUIRE_NETNS").is_ok_and(|v| v == "1") {
        panic!("{test}: the fault harness cannot run: {why}, and AGENTLOOP_REQUIRE_NETNS=1");
    }
    eprintln!("\n!!!!! SKIPPED {test}: {why} (set AGENTLOOP_REQUIRE_NETNS=1 to fail) !!!!!\n");
    false
}

/// How long the harness waits between two looks at what is still running.
const POLL: Duration = Duration::from_millis(250);

/// Runs the cluster, the schedule and the workload, then the checker.
///
/// # Errors
///
/// When this machine cannot run it ([`unavailable`]), the hosts, the servers or the
/// cluster cannot be brought up, or the end state cannot be read; a broken promise is not
/// an error but a finding of the report.
pub async fn run(options: &Options) -> anyhow::Result<Report> {
    if let Some(why) = unavailable() {
        anyhow::bail!("the fault harness cannot run here: {why}");
    }
    let names: Vec<&str> = ORCHESTRATORS
        .iter()
        .chain(&SERVICES)
        .chain(&[network_policy::OUTSIDER])
        .copied()
        .collect();
    let network = Network::create(&names).context("cannot create the hosts")?;
    // The manifests beside the script: deploy/local/cluster -> deploy/k8s.
    let k8s = options
        .script
        .parent()
        .and_then(std::path::Path::parent)
        .context("the cluster script has no deploy folder")?
        .join("k8s");
    network_policy::enforce(
        &network,
        &[
            &k8s.join("common/default-deny.yaml"),
            &k8s.join("base/networkpolicies.yaml"),
        ],
    )?;
    let postgres_host = network.host("postgres")?.clone();
    let postgres = tokio::task::spawn_blocking(move || {
        HostedPostgres::start(&postgres_host.namespace, postgres_host.address.into())
    })
    .await?
    .map_err(anyhow::Error::msg)?;
    let redis_host = network.host("redis")?;
    let redis = agentloop_lease::testing::RedisServer::start_hosted(
        &redis_host.namespace,
        redis_host.address.into(),
    )
    .await;
    let events = postgres.server().create_database().await?;
    let ledger = postgres.server().create_database().await?;
    let lease_ms = options.lease.as_millis();
    let cluster = LocalCluster::up(&ClusterOptions {
        script: options.script.clone(),
        bin_dir: options.bin_dir.clone(),
        parent_dir: None,
        database_url: events.url().to_owned(),
        ledger_database_url: ledger.url().to_owned(),
        redis_url: redis.url(),
        env: vec![
            format!("AGENTLOOP_ORCHESTRATOR_WORKERS__LEASE_TTL_MS={lease_ms}"),
            format!(
                "AGENTLOOP_ORCHESTRATOR_WORKERS__SWEEP_EVERY_MS={}",
                lease_ms / 2
            ),
        ],
        netns: Some(network.prefix().to_owned()),
    })
    .await?;
    let report = exercise(options, &network, &cluster, events.url()).await;
    if report.is_err() {
        for process in names.iter().take(ORCHESTRATORS.len()) {
            tracing::warn!(process, log = %tail(&cluster.log(process), 20), "the run failed");
        }
    }
    cluster.down().await?;
    drop((events, ledger, redis, postgres, network));
    report
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

async fn exercise(
    options: &Options,
    network: &Network,
    cluster: &LocalCluster,
    events_url: &str,
) -> anyhow::Result<Report> {
    let mut clients = Vec::new();
    for endpoint in cluster.orchestrators()? {
        clients.push(cluster.client(endpoint).await?);
    }
    let clients = Arc::new(clients);
    let network_policy = network_policy::probe(network).await?;
    let steps = schedule::schedule(options.seed, options.rounds, options.lease);
    let began = Instant::now();
    let run_key = format!("chaos-{}-{}", options.seed, uuid::Uuid::new_v4().simple());
    let workload = tokio::spawn({
        let clients = Arc::clone(&clients);
        let (count, span) = (options.invocations, schedule::healed_at(&steps));
        async move { workload::start_all(clients, count, span, &run_key).await }
    });
    for step in &steps {
        tokio::time::sleep_until(began + Duration::from_millis(step.at_ms)).await;
        tracing::info!(fault = %step.fault, hold_ms = step.hold_ms, "fault");
        let active = fault::apply(network, &step.fault)?;
        tokio::time::sleep(Duration::from_millis(step.hold_ms)).await;
        active.heal().await?;
    }
    let started = workload.await.context("the workload failed")?;
    let calm = Instant::now();
    let (ids, not_started): (Vec<_>, Vec<_>) = started.into_iter().partition(Result::is_ok);
    let ids: Vec<String> = ids.into_iter().filter_map(Result::ok).collect();
    let not_started: Vec<String> = not_started.into_iter().filter_map(Result::err).collect();

    let mut left = ids.clone();
    while !left.is_empty() && calm.elapsed() < options.recovery_bound {
        // The interval of a bounded wait for the cluster to finish, not synchronisation.
        tokio::time::sleep(POLL).await;
        left = workload::unfinished(&clients, &left).await?;
    }
    let recovered_ms = left
        .is_empty()
        .then(|| u64::try_from(calm.elapsed().as_millis()).unwrap_or(u64::MAX));
    let elapsed = began.elapsed();

    let (invocations, ledger, turns) = workload::read_back(Arc::clone(&clients), &ids).await?;
    let record_dir = cluster.data_dir("demo-executor");
    let record = agentloop_demo_executor::read_record(&record_dir)
        .with_context(|| format!("cannot read the record in {}", record_dir.display()))?
        .into_iter()
        .map(|write| Applied {
            invocation_id: write.invocation_id,
            call_id: write.call_id,
            effect_key: write.effect_key,
        })
        .collect();
    let trail = read_trail(events_url).await?;
    let verdict = check::check(&Observed {
        invocations,
        ledger,
        record,
        trail,
    });
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let turns_per_second = turns as f64 / elapsed.as_secs_f64().max(0.001);
    Ok(Report {
        seed: options.seed,
        schedule: steps,
        started: ids.len(),
        not_started,
        turns,
        elapsed_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
        turns_per_second,
        recovered_ms,
        network_policy,
        verdict,
    })
}

/// The whole fencing trail of the event store at `url`.
async fn read_trail(url: &str) -> anyhow::Result<Vec<TrailStep>> {
    let store = PgStore::connect(PgOptions::new(url)).await?;
    let mut trail = Vec::new();
    let mut after = 0;
    // Bounded: a page per 500 steps, and a run commits a few per invocation.
    for _ in 0..100_000 {
        let page = store.fencing_trail(after, 500).await?;
        let Some(last) = page.last() else { break };
        after = last.position;
        trail.extend(page.iter().map(|entry| TrailStep {
            invocation_id: entry.invocation_id,
            lease_epoch: entry.lease_epoch,
            seq: entry.seq,
        }));
    }
    Ok(trail)
}
