//! Canned histories: each file under `tests/histories/` is a sequence of inputs with the
//! actions the engine must answer each one with. Each is replayed step by step (every
//! answer must match) and as a whole (restoring from all its committed events must give
//! the state the step-by-step run reached).
//!
//! The files are the reviewed record of the engine's behaviour. After an intended change,
//! re-record them with
//! `cargo test -p agentloop-engine --test replay -- --ignored record_histories`
//! and review the diff like code.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentloop_engine::*;
use agentloop_testkit::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct History {
    description: String,
    limits: Limits,
    catalog: ToolCatalog,
    steps: Vec<Step>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Step {
    now: UnixMillis,
    input: Input,
    actions: Vec<Action>,
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/histories")
}

fn histories() -> Vec<(PathBuf, History)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let history =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path, history)
        })
        .collect()
}

fn committed_events(steps: &[Step]) -> Vec<Event> {
    // A commit's events count as durable once the next input acknowledges it.
    let mut log = Vec::new();
    let mut pending: Vec<Event> = Vec::new();
    for step in steps {
        if step.input == Input::Committed {
            log.append(&mut pending);
        }
        pending.clear();
        for action in &step.actions {
            if let Action::Commit { events, .. } = action {
                pending.extend(events.iter().cloned());
            }
        }
    }
    log
}

#[test]
fn canned_histories_replay_step_by_step_and_whole() {
    let histories = histories();
    assert!(histories.len() >= 4, "the canned histories are missing");
    for (path, history) in histories {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let mut invocation = Invocation::new(history.limits, Arc::new(history.catalog.clone()));
        for (index, step) in history.steps.iter().enumerate() {
            let actions = invocation
                .step(step.input.clone(), step.now)
                .unwrap_or_else(|e| panic!("{name} step {index}: refused: {e}"));
            assert_eq!(
                actions, step.actions,
                "{name} step {index} ({:?})",
                step.input
            );
        }
        let outcome = invocation
            .outcome()
            .unwrap_or_else(|| panic!("{name} does not end"));

        let log = committed_events(&history.steps);
        let whole = Invocation::restore(history.limits, Arc::new(history.catalog), &log).unwrap();
        assert_eq!(
            whole.protocol(),
            invocation.protocol(),
            "{name}: restored state differs"
        );
        assert_eq!(
            whole.outcome(),
            Some(outcome),
            "{name}: restored outcome differs"
        );
    }
}

// ---- Recording. ----

fn decided(decision: ProposedDecision, input_tokens: u64) -> Input {
    Input::Decided {
        decision,
        usage: Usage {
            input_tokens,
            output_tokens: 12,
            cost: None,
        },
    }
}

fn finished(id: &str, outcome: CallOutcome) -> Input {
    Input::CallFinished {
        call_id: CallId::new(id),
        outcome,
    }
}

fn record(name: &str, description: &str, limits: Limits, inputs: Vec<(u64, Input)>) {
    let catalog = (*catalog()).clone();
    let mut invocation = Invocation::new(limits, Arc::new(catalog.clone()));
    let steps = inputs
        .into_iter()
        .map(|(now, input)| {
            let actions = invocation.step(input.clone(), UnixMillis(now)).unwrap();
            Step {
                now: UnixMillis(now),
                input,
                actions,
            }
        })
        .collect();
    let history = History {
        description: description.into(),
        limits,
        catalog,
        steps,
    };
    let text = serde_json::to_string_pretty(&history).unwrap() + "\n";
    std::fs::write(dir().join(format!("{name}.json")), text).unwrap();
}

#[test]
#[ignore = "rewrites the canned histories; run on purpose and review the diff"]
fn record_histories() {
    let limits = Limits::default();
    record(
        "01_demo_parallel_lookup",
        "The demo: two parallel lookups answering out of order, then a verified answer.",
        limits,
        vec![
            (0, Input::Start),
            (
                1,
                decided(
                    tools(vec![
                        lookup("call-profile", "profile"),
                        lookup("call-policy", "policy"),
                    ]),
                    300,
                ),
            ),
            (2, Input::Authorized(Verdict::Allow.into())),
            (
                3,
                finished(
                    "call-policy",
                    output(r#"{"key":"policy","value":"refund-under-100"}"#),
                ),
            ),
            (
                4,
                finished(
                    "call-profile",
                    output(r#"{"key":"profile","value":"active"}"#),
                ),
            ),
            (5, Input::Committed),
            (
                6,
                decided(final_answer("profile=active; policy=refund-under-100"), 420),
            ),
            (
                7,
                Input::Verified(Verification::Accepted { checks: vec![] }),
            ),
            (8, Input::Committed),
        ],
    );
    record(
        "02_cancel_mid_batch",
        "A cancel while a sleep runs: the call is cancelled, the finished lookup kept, the turn and the end committed together.",
        limits,
        vec![
            (0, Input::Start),
            (
                1,
                decided(
                    tools(vec![
                        lookup("a", "profile"),
                        call("b", "sleep", r#"{"ms":60000}"#),
                    ]),
                    100,
                ),
            ),
            (2, Input::Authorized(Verdict::Allow.into())),
            (
                3,
                finished("a", output(r#"{"key":"profile","value":"active"}"#)),
            ),
            (
                4,
                Input::Cancel {
                    reason: String::new(),
                },
            ),
            (5, finished("b", CallOutcome::Cancelled)),
            (6, Input::Committed),
        ],
    );
    record(
        "03_reconcile_then_repair",
        "A transfer whose reply was lost is reconciled before the next decision; an answer without evidence gets one repair turn.",
        limits,
        vec![
            (0, Input::Start),
            (
                1,
                decided(
                    tools(vec![call(
                        "t1",
                        "transfer",
                        r#"{"to":"acct-7","amount":40}"#,
                    )]),
                    100,
                ),
            ),
            (2, Input::Authorized(Verdict::Allow.into())),
            // The transfer's batch is committed as started before it is sent.
            (2, Input::Committed),
            (
                3,
                finished(
                    "t1",
                    CallOutcome::Unknown {
                        detail: "reply lost after dispatch".into(),
                    },
                ),
            ),
            (
                4,
                Input::Reconciled {
                    call_id: CallId::new("t1"),
                    outcome: output(r#"{"applied":true,"effect_id":"fx-1"}"#),
                },
            ),
            (5, Input::Committed),
            (6, decided(final_answer("refunded"), 200)),
            (
                7,
                Input::Verified(Verification::Rejected {
                    reason: "cite the effect id".into(),
                    checks: vec![],
                }),
            ),
            (8, Input::Committed),
            (
                9,
                decided(final_answer("refunded 40 to acct-7 (fx-1)"), 250),
            ),
            (
                10,
                Input::Verified(Verification::Accepted { checks: vec![] }),
            ),
            (11, Input::Committed),
        ],
    );
    record(
        "04_deadline_tick",
        "The deadline passes while a call runs: a tick cancels it and the invocation ends deadline_exceeded.",
        Limits {
            deadline: Some(UnixMillis(1_000)),
            ..limits
        },
        vec![
            (0, Input::Start),
            (
                10,
                decided(tools(vec![call("s", "sleep", r#"{"ms":5000}"#)]), 50),
            ),
            (11, Input::Authorized(Verdict::Allow.into())),
            (500, Input::Tick),
            (1_000, Input::Tick),
            (1_003, finished("s", CallOutcome::Cancelled)),
            (1_004, Input::Committed),
        ],
    );
}
