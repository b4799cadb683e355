//! `agentloop replay`: invocations that ran under one policy set, judged again under
//! another, report exactly the calls the other decides differently; and a replay writes
//! nothing, neither to the log nor to the ledger.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly"
)]

mod common;

use std::path::Path;

use agentloop_store::{EventStore, ListRequest, SqliteStore};
use common::{agentloop, stderr, stdout};

/// Every call may run.
const PERMISSIVE: &str = r#"
@id("anything-goes")
permit (principal, action == Agentloop::Action::"call", resource);
"#;

/// Lookups for everyone; transfers of at most 100.00, for clerks only.
const STRICT: &str = r#"
@id("lookups")
permit (principal, action == Agentloop::Action::"call", resource == Agentloop::Tool::"lookup");
@id("small-transfers-for-clerks")
permit (principal, action == Agentloop::Action::"call", resource == Agentloop::Tool::"transfer")
when { principal.roles.contains("clerk") && context.arguments has amount && context.arguments.amount <= 10000 };
"#;

/// A lookup and a transfer of `amount` cents in one batch, then an answer citing both
/// (or, when the batch is refused, an answer saying so).
fn script(amount: u64) -> String {
    format!(
        r#"{{"turns": [
          {{"tool_calls": [{{"id": "look", "name": "lookup", "arguments": {{"key": "profile"}}}},
                          {{"id": "pay", "name": "transfer", "arguments": {{"from": "ops", "to": "acct-1", "amount": {amount}}}}}]}},
          {{"final": "done", "evidence": ["look"]}}
        ]}}"#
    )
}

/// Runs `script` embedded in `dir` under `policies` with `roles`; returns its ID once it
/// ended with `reason`.
fn run(dir: &Path, amount: u64, policies: &str, roles: &str, reason: &str) -> String {
    let file = dir.join(format!("script-{amount}.json"));
    std::fs::write(&file, script(amount)).unwrap();
    let output = agentloop(dir)
        .args(["--data-dir", "data", "run", "--json", "--on-wait", "exit"])
        .arg("--script")
        .arg(&file)
        .args(["--policies", policies, "--roles", roles])
        .output()
        .unwrap();
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("{}{}", stdout(&output), stderr(&output)));
    assert_eq!(summary["reason"], reason, "{summary}");
    summary["invocation_id"].as_str().unwrap().to_owned()
}

fn replay(dir: &Path, args: &[&str]) -> serde_json::Value {
    let output = agentloop(dir)
        .args(["--data-dir", "data", "replay", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// `(invocation, call)` of every change of `kind` in a replay's report, sorted.
fn changes(report: &serde_json::Value, kind: &str) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = report["invocations"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|one| {
            let id = one["invocation_id"].as_str().unwrap().to_owned();
            one[kind]
                .as_array()
                .unwrap()
                .iter()
                .map(move |change| (id.clone(), change["call_id"].as_str().unwrap().to_owned()))
        })
        .collect();
    found.sort();
    found
}

#[test]
fn replay_reports_exactly_the_calls_a_stricter_policy_refuses() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("permissive.cedar"), PERMISSIVE).unwrap();
    std::fs::write(dir.path().join("strict.cedar"), STRICT).unwrap();
    // Under the permissive set: a large transfer by a clerk, a small one by a clerk, a
    // small one by someone who is not a clerk.
    let large = run(dir.path(), 25_000, "permissive.cedar", "clerk", "completed");
    let small = run(dir.path(), 5_000, "permissive.cedar", "clerk", "completed");
    let not_clerk = run(
        dir.path(),
        5_000,
        "permissive.cedar",
        "auditor",
        "completed",
    );
    // Under the strict set: the large transfer is refused then, which ends a script.
    let refused_then = run(
        dir.path(),
        25_000,
        "strict.cedar",
        "clerk",
        "invalid_decision",
    );

    let report = replay(dir.path(), &["--all", "--policies", "strict.cedar"]);
    assert_eq!(
        changes(&report, "now_refused"),
        {
            let mut expected = vec![
                (large.clone(), "pay".to_owned()),
                (not_clerk.clone(), "pay".to_owned()),
            ];
            expected.sort();
            expected
        },
        "exactly the transfers the strict set refuses: {report:#}"
    );
    assert!(changes(&report, "now_need_approval").is_empty());
    assert!(changes(&report, "now_allowed").is_empty());
    let refused = report["invocations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|one| one["invocation_id"] == large.as_str())
        .unwrap();
    assert_eq!(refused["now_refused"][0]["tool"], "transfer");
    assert_eq!(report["totals"]["invocations"], 4);
    assert_eq!(report["totals"]["changed"], 2);
    assert_eq!(report["totals"]["calls"], 8, "every call judged again");

    // Today's acceptance rules want a cited transfer: every completed answer cited only
    // its lookup, so each would now be rejected (the refused run gave no answer).
    std::fs::write(
        dir.path().join("accept.toml"),
        "[[require]]\ntool = \"transfer\"\n",
    )
    .unwrap();
    let report = replay(
        dir.path(),
        &[
            "--all",
            "--policies",
            "permissive.cedar",
            "--acceptance",
            "accept.toml",
        ],
    );
    assert_eq!(report["totals"]["answers"], 3, "{report:#}");
    assert_eq!(report["totals"]["answers_now_rejected"], 3, "{report:#}");

    // The other way round: what the strict set refused, the permissive one allows, and
    // nothing that ran would now be refused.
    let report = replay(dir.path(), &["--all", "--policies", "permissive.cedar"]);
    assert_eq!(
        changes(&report, "now_allowed"),
        vec![(refused_then.clone(), "pay".to_owned())]
    );
    assert!(changes(&report, "now_refused").is_empty());

    // Named invocations only, as text.
    let output = agentloop(dir.path())
        .args(["--data-dir", "data", "replay", &small, &large])
        .args(["--policies", "strict.cedar"])
        .output()
        .unwrap();
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        text.starts_with(&format!(
            "{small} (completed): 1 batches, 2 calls, 1 answers judged again\n  unchanged\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(r#"  now refused: turn 1 call pay transfer {"from": "ops", "to": "acct-1", "amount": 25000}: "#),
        "{text}"
    );
    assert!(
        text.ends_with("2 invocations, 1 would change: 1 calls now refused, 0 now need approval, 0 now allowed, 0 answers now rejected\n"),
        "{text}"
    );
}

/// The log (every invocation's row and events) and the ledger (every entry) as text.
async fn snapshot(data: &Path, ids: &[String]) -> String {
    let store = SqliteStore::open_in(data).await.unwrap();
    let mut text = format!(
        "{:?}\n",
        store
            .list(ListRequest {
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap()
    );
    let ledger = agentloop_ledger::LedgerConfig {
        data_dir: data.join(agentloop_stack::LEDGER_DIR),
        ..Default::default()
    }
    .open_store()
    .await
    .unwrap();
    for id in ids {
        let uuid = uuid::Uuid::parse_str(id).unwrap();
        text.push_str(&format!(
            "{:?}\n",
            store.events(uuid, 1, 1_000).await.unwrap()
        ));
        let entries = ledger.list_by_invocation(id, 100, None).await.unwrap();
        text.push_str(&format!("{entries:?}\n"));
    }
    text
}

#[tokio::test]
async fn replay_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("permissive.cedar"), PERMISSIVE).unwrap();
    std::fs::write(dir.path().join("strict.cedar"), STRICT).unwrap();
    let ids = vec![
        run(dir.path(), 25_000, "permissive.cedar", "clerk", "completed"),
        run(dir.path(), 5_000, "permissive.cedar", "clerk", "completed"),
    ];
    let data = dir.path().join("data");
    let before = snapshot(&data, &ids).await;
    assert!(
        before.contains("transfer"),
        "the ledger holds the writes: {before}"
    );

    let dir_path = dir.path().to_owned();
    let report = tokio::task::spawn_blocking(move || {
        replay(&dir_path, &["--all", "--policies", "strict.cedar"])
    })
    .await
    .unwrap();
    assert_eq!(report["totals"]["now_refused"], 1, "{report:#}");

    assert_eq!(
        snapshot(&data, &ids).await,
        before,
        "the log and the ledger are unchanged"
    );
}
