//! `agentloop bench` as a user runs it: a small workload in each mode, and the reported
//! figures agree with each other and with the workload.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn bench(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .arg("bench")
        .arg("--dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap()
}

/// The reports of a run that succeeded, one JSON line each.
fn reports(output: &Output) -> Vec<Value> {
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The one report of a run that succeeded.
fn report(output: &Output) -> Value {
    let [report] =
        <[Value; 1]>::try_from(reports(output)).unwrap_or_else(|all| panic!("one report: {all:?}"));
    report
}

fn number(report: &Value, field: &str) -> f64 {
    report[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number in {report}"))
}

/// The figures every run must satisfy, whatever the machine.
fn check_consistent(report: &Value, invocations: u64, turns: u64) {
    assert_eq!(report["invocations"], invocations);
    assert_eq!(report["turns_per_invocation"], turns);
    assert_eq!(report["completed"], invocations, "{report}");
    assert_eq!(report["failed"], 0);
    assert!(report["first_failure"].is_null());
    assert_eq!(report["turns"], invocations * turns);
    let elapsed = number(report, "elapsed_s");
    let rate = number(report, "turns_per_s");
    assert!(elapsed > 0.0);
    let expected_rate = (invocations * turns) as f64 / elapsed;
    assert!(
        (rate - expected_rate).abs() <= expected_rate * 1e-6,
        "{report}"
    );
    assert!(number(report, "cpu_us_per_turn") > 0.0);
    assert!(number(report, "peak_rss_bytes") > 1_000_000.0);
    match report["mode"].as_str() {
        Some("cluster") => check_backends(report, invocations, turns),
        Some("embedded" | "distributed") => check_store(report, invocations, turns),
        other => panic!("mode {other:?} in {report}"),
    }
}

/// The SQLite store's figures of an in-process run.
fn check_store(report: &Value, invocations: u64, turns: u64) {
    let fsyncs = number(report, "fsyncs");
    assert!(fsyncs > 0.0, "every turn is committed durably");
    let per_turn = number(report, "fsyncs_per_turn");
    assert!((per_turn - fsyncs / (invocations * turns) as f64).abs() < 1e-9);
    assert!(number(report, "largest_group") >= 1.0);
    let stored = number(report, "stored_bytes_per_turn");
    let bodies = number(report, "event_bytes_per_turn");
    assert!(bodies > 100.0 && stored > bodies, "{report}");
    assert!(report.get("postgres_statements_per_turn").is_none());
}

/// What a cluster run's processes asked of PostgreSQL and Redis.
fn check_backends(report: &Value, invocations: u64, turns: u64) {
    assert_eq!(report["processes"], 7, "{report}");
    assert_eq!(
        report["auth"], true,
        "the cluster's orchestrators verify a JWT"
    );
    // Every turn is committed to PostgreSQL: at least one statement and round trip each.
    assert!(
        number(report, "postgres_statements_per_turn") >= 1.0,
        "{report}"
    );
    assert!(
        number(report, "postgres_round_trips_per_turn") >= 1.0,
        "{report}"
    );
    // Every invocation takes a lease in Redis.
    let commands = number(report, "redis_commands_per_turn");
    assert!(
        commands * (invocations * turns) as f64 >= invocations as f64,
        "{report}"
    );
    let by_name: f64 = report["redis_commands_by_name_per_turn"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_f64().unwrap())
        .sum();
    assert!((by_name - commands).abs() < 1e-9, "{report}");
    assert!(report.get("fsyncs").is_none(), "{report}");
}

fn check_latencies(report: &Value) {
    for field in ["turn_latency_ms", "invocation_latency_ms"] {
        let p50 = report[field]["p50"].as_f64().unwrap();
        let p99 = report[field]["p99"].as_f64().unwrap();
        assert!(p50 > 0.0 && p50 <= p99, "{field}: {report}");
    }
    // An invocation takes at least its turns after the first.
    assert!(
        report["invocation_latency_ms"]["p99"].as_f64().unwrap()
            >= report["turn_latency_ms"]["p50"].as_f64().unwrap()
    );
}

#[test]
fn embedded_bench_reports_consistent_figures() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(
        dir.path(),
        &["--invocations", "12", "--turns", "4", "--json"],
    );
    let report = report(&output);
    assert_eq!(report["mode"], "embedded");
    check_consistent(&report, 12, 4);
    check_latencies(&report);
    assert!(report["park"].is_null());
    // Twelve invocations in flight share commits: fewer fsyncs than commits of turns.
    assert!(number(&report, "fsyncs") < 12.0 * 4.0, "{report}");
    // The temporary data directory is gone afterwards.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn distributed_bench_reports_consistent_figures() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(
        dir.path(),
        &[
            "--invocations",
            "6",
            "--turns",
            "3",
            "--mode",
            "distributed",
            "--json",
        ],
    );
    let report = report(&output);
    assert_eq!(report["mode"], "distributed");
    check_consistent(&report, 6, 3);
    check_latencies(&report);
}

/// `bench --mode cluster` on a PostgreSQL and a Redis of the test's: the three wirings
/// in one run, then the bench's databases are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_bench_runs_the_three_wirings_and_counts_what_the_cluster_asks_of_its_backends() {
    let Some(postgres) = agentloop_store::testing::PostgresServer::for_test("cluster_bench").await
    else {
        return;
    };
    let Some(redis) = agentloop_lease::testing::RedisServer::start_or_skip("cluster_bench").await
    else {
        return;
    };
    let count_bench_databases = || async {
        let mut conn = agentloop_store::databases::connect(postgres.admin_url())
            .await
            .unwrap();
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_database WHERE datname LIKE 'agentloop\\_bench\\_%'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap()
    };
    let databases_before = count_bench_databases().await;
    let dir = tempfile::tempdir().unwrap();
    let (admin_url, redis_url) = (postgres.admin_url().to_owned(), redis.url());
    let path = dir.path().to_owned();
    let output = tokio::task::spawn_blocking(move || {
        bench(
            &path,
            &[
                "--mode",
                "cluster",
                "--invocations",
                "6",
                "--turns",
                "3",
                "--postgres-url",
                &admin_url,
                "--redis-url",
                &redis_url,
                "--json",
            ],
        )
    })
    .await
    .unwrap();
    let reports = reports(&output);
    let [embedded, distributed, cluster] = reports.as_slice() else {
        panic!("three runs: {reports:?}")
    };
    assert_eq!(embedded["mode"], "embedded");
    assert_eq!(distributed["mode"], "distributed");
    assert_eq!(cluster["mode"], "cluster");
    for report in [embedded, distributed, cluster] {
        check_consistent(report, 6, 3);
        check_latencies(report);
    }
    assert_eq!(count_bench_databases().await, databases_before);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn cluster_mode_refuses_what_only_an_in_process_run_measures() {
    let dir = tempfile::tempdir().unwrap();
    for flag in ["--park", "--traces"] {
        let output = bench(dir.path(), &["--mode", "cluster", flag]);
        assert_eq!(output.status.code(), Some(1), "{flag}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("embedded or distributed"),
            "{flag}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn traces_runs_the_workload_untraced_then_exporting_every_span() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(
        dir.path(),
        &[
            "--invocations",
            "6",
            "--turns",
            "3",
            "--mode",
            "distributed",
            "--traces",
            "--json",
        ],
    );
    let reports = reports(&output);
    let [off, on] = reports.as_slice() else {
        panic!("two runs: {reports:?}")
    };
    for report in [off, on] {
        check_consistent(report, 6, 3);
    }
    assert_eq!(off["traces"], false);
    assert_eq!(number(off, "spans_per_turn"), 0.0);
    assert_eq!(on["traces"], true);
    // A lookup turn alone is a Decide, a chat, an authorize, a policy Evaluate, two
    // execute_tool, the gateway's stage, two executor calls and a commit.
    assert!(number(on, "spans_per_turn") >= 4.0, "{on}");
    assert_eq!(number(on, "spans_dropped"), 0.0, "{on}");
}

#[test]
fn park_mode_reports_memory_per_parked_invocation() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(
        dir.path(),
        &["--invocations", "50", "--turns", "2", "--park", "--json"],
    );
    let report = report(&output);
    check_consistent(&report, 50, 2);
    let park = &report["park"];
    assert_eq!(park["parked"], 50);
    let before = park["rss_before_bytes"].as_f64().unwrap();
    let parked = park["rss_parked_bytes"].as_f64().unwrap();
    let each = park["bytes_per_parked_invocation"].as_f64().unwrap();
    assert!(before > 0.0 && parked > 0.0);
    assert!(
        (each - (parked - before).max(0.0) / 50.0).abs() < 1e-6,
        "{report}"
    );
}

#[test]
fn text_output_names_each_figure() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(dir.path(), &["--invocations", "3", "--turns", "2"]);
    assert_eq!(output.status.code(), Some(0));
    let text = String::from_utf8(output.stdout).unwrap();
    for expected in [
        "3 invocations x 2 turns",
        "completed        3 of 3",
        "turns            6 in",
        "turns/s",
        "commit to commit",
        "per turn (all threads)",
        "peak RSS",
        "B per turn",
        "fsyncs",
    ] {
        assert!(text.contains(expected), "{expected:?} missing from\n{text}");
    }
}

#[test]
fn out_of_range_workloads_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let zero = bench(dir.path(), &["--invocations", "0"]);
    assert_eq!(zero.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&zero.stderr).contains("--invocations"));
    let mode = bench(dir.path(), &["--mode", "sideways"]);
    assert_eq!(mode.status.code(), Some(2));
}
