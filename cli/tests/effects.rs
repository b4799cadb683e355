//! `agentloop effects --unresolved` as an operator runs it: the real binary against a
//! running orchestrator (whose ledger is its own gRPC server) and on a data directory's
//! ledger file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

use agentloop_ledger::{LedgerConfig, LedgerStore, NewEffect, Outcome, effect_key};
use agentloop_proto::client::Transport;
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::effect_ledger_service_client::EffectLedgerServiceClient;
use agentloop_stack::{Stack, StackOptions, Wiring};
use serde_json::Value;

/// Runs the binary off the runtime's worker threads, so the in-process server keeps
/// serving while the test waits for it.
async fn agentloop(data_dir: &Path, args: &[&str]) -> Output {
    let data_dir = data_dir.to_owned();
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .arg("--data-dir")
            .arg(data_dir)
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

fn json_lines(output: &Output) -> Vec<Value> {
    stdout(output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// A deployment whose ledger the test writes to directly (as the orchestrator would, with
/// its service token) and whose orchestrator the CLI asks (`--server`).
struct Ledger {
    endpoint: String,
    client: EffectLedgerServiceClient<Transport>,
    stack: Stack,
}

/// The distributed stack over `data_dir`: its ledger is its own gRPC server, keeping its
/// file under `data_dir` as the embedded one does.
async fn start_ledger(data_dir: &Path) -> Ledger {
    agentloop_server::install_crypto_provider();
    let stack = Stack::start(StackOptions {
        wiring: Wiring::Distributed,
        ..StackOptions::embedded(data_dir.to_owned())
    })
    .await
    .unwrap();
    let endpoints = stack.endpoints().unwrap();
    let transport =
        agentloop_stack::channel_as(&endpoints.ledger, Some(&endpoints.tokens.orchestrator))
            .await
            .unwrap();
    Ledger {
        endpoint: stack.endpoint(),
        client: agentloop_proto::client::effect_ledger(transport),
        stack,
    }
}

impl Ledger {
    async fn stop(self) {
        drop(self.client);
        self.stack.stop().await.unwrap();
    }
}

/// Where an entry is left, driven through the ledger's own RPCs.
#[derive(Debug, Clone, Copy)]
enum Leave {
    Prepared,
    Dispatched,
    Unknown,
    Flagged,
    Committed,
}

async fn leave(
    client: &mut EffectLedgerServiceClient<Transport>,
    invocation: &str,
    call: &str,
    at: Leave,
) {
    let key = effect_key(invocation, call);
    client
        .prepare(pb::PrepareRequest {
            invocation_id: invocation.into(),
            call_id: call.into(),
            effect_key: key.clone(),
            tool: "transfer".into(),
        })
        .await
        .unwrap();
    if matches!(at, Leave::Prepared) {
        return;
    }
    client
        .mark_dispatched(pb::MarkDispatchedRequest {
            effect_key: key.clone(),
            expected_state: pb::EffectState::Prepared as i32,
        })
        .await
        .unwrap();
    let record =
        |expected: pb::EffectState, state: pb::EffectState, detail: &str| pb::RecordRequest {
            effect_key: key.clone(),
            expected_state: expected as i32,
            state: state as i32,
            receipt: String::new(),
            detail: detail.into(),
        };
    let outcome = match at {
        Leave::Prepared | Leave::Dispatched => return,
        Leave::Committed => pb::EffectState::Committed,
        Leave::Unknown | Leave::Flagged => pb::EffectState::OutcomeUnknown,
    };
    client
        .record(record(
            pb::EffectState::Dispatched,
            outcome,
            "deadline exceeded",
        ))
        .await
        .unwrap();
    if matches!(at, Leave::Flagged) {
        client
            .record(record(
                pb::EffectState::OutcomeUnknown,
                pb::EffectState::ReconciliationRequired,
                "executor cannot tell\nwhether it applied",
            ))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_unresolved_entries_of_a_ledger_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = start_ledger(&dir.path().join("ledger-service")).await;
    leave(&mut ledger.client, "inv-a", "c1", Leave::Prepared).await;
    leave(&mut ledger.client, "inv-a", "c2", Leave::Dispatched).await;
    leave(&mut ledger.client, "inv-b", "c3", Leave::Flagged).await;
    leave(&mut ledger.client, "inv-b", "c4", Leave::Committed).await;
    leave(&mut ledger.client, "inv-b", "c5", Leave::Unknown).await;
    let endpoint = ledger.endpoint.clone();
    // The CLI must not read the (empty) data directory when --server is given.
    let empty = dir.path().join("unused");

    let output = agentloop(&empty, &["effects", "--unresolved", "--server", &endpoint]).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert!(lines[0].starts_with("STATE"), "{text}");
    let states: Vec<&str> = lines[1..5]
        .iter()
        .map(|line| line.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        states,
        [
            "prepared",
            "dispatched",
            "reconciliation_required",
            "outcome_unknown"
        ]
    );
    assert!(
        lines[3].contains(&effect_key("inv-b", "c3")),
        "the operator sees the key the executor dedupes on: {text}"
    );
    assert!(
        lines[3].ends_with("executor cannot tell whether it applied"),
        "{text}"
    );
    assert!(
        !text.contains(" c4 "),
        "committed entries are not listed: {text}"
    );
    assert_eq!(
        lines[5],
        "4 unresolved; 1 need an operator (reconciliation_required)"
    );

    let output = agentloop(
        &empty,
        &["effects", "--unresolved", "--server", &endpoint, "--json"],
    )
    .await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let entries = json_lines(&output);
    let calls: Vec<&str> = entries
        .iter()
        .map(|e| e["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(calls, ["c1", "c2", "c3", "c5"]);
    assert_eq!(entries[2]["state"], "reconciliation_required");
    assert_eq!(
        entries[2]["detail"],
        "executor cannot tell\nwhether it applied"
    );
    assert_eq!(entries[2]["effect_key"], effect_key("inv-b", "c3"));
    assert_eq!(entries[2]["attempt"], 1);
    assert!(entries[2]["updated_at_ms"].as_i64().unwrap() > 0);

    let output = agentloop(
        &empty,
        &[
            "effects",
            "--unresolved",
            "--server",
            &endpoint,
            "--invocation",
            "inv-b",
            "--json",
        ],
    )
    .await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let calls: Vec<String> = json_lines(&output)
        .iter()
        .map(|e| e["call_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(calls, ["c3", "c5"]);

    // The operator settles c3; it leaves the listing.
    ledger
        .client
        .record(pb::RecordRequest {
            effect_key: effect_key("inv-b", "c3"),
            expected_state: pb::EffectState::ReconciliationRequired as i32,
            state: pb::EffectState::Committed as i32,
            receipt: "txn-9".into(),
            detail: "operator: found in the bank statement".into(),
        })
        .await
        .unwrap();
    let output = agentloop(
        &empty,
        &[
            "effects",
            "--unresolved",
            "--server",
            &endpoint,
            "--invocation",
            "inv-b",
        ],
    )
    .await;
    let text = stdout(&output);
    assert!(
        text.ends_with("1 unresolved; 0 need an operator (reconciliation_required)\n"),
        "{text}"
    );
    let output = agentloop(
        &empty,
        &[
            "effects",
            "--unresolved",
            "--server",
            &endpoint,
            "--invocation",
            "inv-none",
        ],
    )
    .await;
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(stdout(&output), "no unresolved effects\n");
    assert!(!empty.exists(), "--server left the data directory alone");
    ledger.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_through_more_entries_than_one_page() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = start_ledger(&dir.path().join("ledger-service")).await;
    // More than one page of the CLI's (500), and more than the server's default (100).
    let total = 520;
    for i in 0..total {
        leave(
            &mut ledger.client,
            "inv-many",
            &format!("c{i:04}"),
            Leave::Prepared,
        )
        .await;
    }
    leave(&mut ledger.client, "inv-other", "x", Leave::Prepared).await;
    let output = agentloop(
        dir.path(),
        &[
            "effects",
            "--unresolved",
            "--server",
            &ledger.endpoint,
            "--invocation",
            "inv-many",
            "--json",
        ],
    )
    .await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let calls: Vec<String> = json_lines(&output)
        .iter()
        .map(|e| e["call_id"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..total).map(|i| format!("c{i:04}")).collect();
    assert_eq!(calls, expected, "every entry once, oldest first");
    ledger.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrator_and_the_data_directory_list_the_same_entries() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mut ledger = start_ledger(&data_dir).await;
    leave(&mut ledger.client, "inv-dev", "c1", Leave::Flagged).await;
    leave(&mut ledger.client, "inv-dev", "c2", Leave::Committed).await;

    let remote = agentloop(
        dir.path(),
        &[
            "effects",
            "--unresolved",
            "--server",
            &ledger.endpoint,
            "--json",
        ],
    )
    .await;
    assert_eq!(remote.status.code(), Some(0), "{}", stderr(&remote));
    // The data directory's file, read while the stack still runs (WAL lets readers in).
    let local = agentloop(&data_dir, &["effects", "--unresolved", "--json"]).await;
    assert_eq!(local.status.code(), Some(0), "{}", stderr(&local));
    assert_eq!(stdout(&local), stdout(&remote));
    let entries = json_lines(&local);
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["call_id"], "c1");
    assert_eq!(entries[0]["state"], "reconciliation_required");
    ledger.stop().await;

    // And after it stopped, as a table.
    let local = agentloop(&data_dir, &["effects", "--unresolved"]).await;
    assert_eq!(local.status.code(), Some(0), "{}", stderr(&local));
    assert!(stdout(&local).contains("reconciliation_required"));
}

#[tokio::test]
async fn reads_a_ledger_file_written_by_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = LedgerConfig {
        data_dir: dir.path().join(agentloop_stack::LEDGER_DIR),
        ..LedgerConfig::default()
    }
    .open_store()
    .await
    .unwrap();
    write_flagged(&store, "inv-file", "c1").await;
    store.close().await;

    let output = agentloop(
        dir.path(),
        &[
            "effects",
            "--unresolved",
            "--invocation",
            "inv-file",
            "--json",
        ],
    )
    .await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let entries = json_lines(&output);
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["detail"], "cannot tell");
}

async fn write_flagged(store: &LedgerStore, invocation: &str, call: &str) {
    let new = NewEffect {
        invocation_id: invocation.into(),
        call_id: call.into(),
        effect_key: effect_key(invocation, call),
        tool: "transfer".into(),
    };
    store.prepare(&new).await.unwrap();
    store
        .mark_dispatched(&new.effect_key, agentloop_ledger::EffectState::Prepared)
        .await
        .unwrap();
    store
        .record(
            &new.effect_key,
            agentloop_ledger::EffectState::Dispatched,
            Outcome::OutcomeUnknown,
            "",
            "lost",
        )
        .await
        .unwrap();
    store
        .record(
            &new.effect_key,
            agentloop_ledger::EffectState::OutcomeUnknown,
            Outcome::ReconciliationRequired,
            "",
            "cannot tell",
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn mistakes_are_reported_with_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    // A directory without a ledger: said so, and nothing is created there.
    let missing = dir.path().join("nothing-here");
    let output = agentloop(&missing, &["effects", "--unresolved"]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("no effect ledger in"),
        "{}",
        stderr(&output)
    );
    assert!(!missing.exists());

    // An orchestrator nobody serves.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let output = agentloop(
        dir.path(),
        &[
            "effects",
            "--unresolved",
            "--server",
            &format!("http://127.0.0.1:{port}"),
        ],
    )
    .await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("cannot reach the orchestrator"),
        "{}",
        stderr(&output)
    );

    // Usage: the listing must be named, and an empty filter is refused.
    let output = agentloop(dir.path(), &["effects"]).await;
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("--unresolved"),
        "{}",
        stderr(&output)
    );
    let output = agentloop(dir.path(), &["effects", "--unresolved", "--invocation", ""]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("--invocation must not be empty"),
        "{}",
        stderr(&output)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_settles_an_effect_through_the_orchestrator_remote_or_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mut ledger = start_ledger(&data_dir).await;
    // A real invocation of the orchestrator (it completes at once), whose writes the
    // test flags in the ledger.
    let id = agentloop_e2e::start(
        &mut agentloop_e2e::client_of(&ledger.stack).await,
        agentloop_e2e::start_request(r#"{"turns": [{"final": "done"}]}"#),
    )
    .await;
    leave(&mut ledger.client, &id, "c1", Leave::Flagged).await;
    leave(&mut ledger.client, &id, "c2", Leave::Flagged).await;
    let (first, second) = (effect_key(&id, "c1"), effect_key(&id, "c2"));
    let settle = |key: &str, outcome: &str, server: Option<&str>| {
        let mut args: Vec<String> = ["effects", "settle", key, "--invocation", &id]
            .into_iter()
            .chain(["--outcome", outcome, "--detail", "read the bank statement"])
            .map(str::to_owned)
            .collect();
        if let Some(server) = server {
            args.extend(["--server", server, "--actor", "olga", "--json"].map(str::to_owned));
        }
        args
    };
    let run = async |data_dir: &Path, args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        agentloop(data_dir, &args).await
    };

    let output = run(
        dir.path(),
        settle(&first, "committed", Some(&ledger.endpoint)),
    )
    .await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let settled = json_lines(&output);
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0]["effect_key"], first);
    assert_eq!(settled[0]["state"], "committed");
    assert_eq!(
        settled[0]["detail"],
        "settled by olga: read the bank statement"
    );
    // Once: a second verdict is refused, and says why.
    let again = run(
        dir.path(),
        settle(&first, "rejected", Some(&ledger.endpoint)),
    )
    .await;
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("FailedPrecondition"),
        "{}",
        stderr(&again)
    );
    ledger.stop().await;

    // With no server, the data directory's own orchestrator settles the other one.
    let output = run(&data_dir, settle(&second, "rejected", None)).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        format!("settled {second} of invocation {id}: rejected\n")
    );
    let listed = agentloop(&data_dir, &["effects", "--unresolved"]).await;
    assert_eq!(stdout(&listed), "no unresolved effects\n");
}
