//! A synchronous shell for driving the engine in tests: a scripted model, fake tools,
//! an in-memory log. Each test file uses the parts it needs.
#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::sync::Arc;

use agentloop_engine::*;

/// A read-only `lookup` tool and a `transfer` write, as in the demo executor.
pub fn catalog() -> Arc<ToolCatalog> {
    Arc::new(
        ToolCatalog::new()
            .with("lookup", ToolSpec::read_only())
            .with("transfer", ToolSpec::new(SideEffect::Write)),
    )
}

pub fn call(id: &str, tool: &str, arguments: &str) -> ProposedCall {
    ProposedCall {
        call_id: id.into(),
        tool: tool.into(),
        arguments_json: arguments.into(),
    }
}

pub fn lookup(id: &str, key: &str) -> ProposedCall {
    call(id, "lookup", &format!(r#"{{"key":"{key}"}}"#))
}

pub fn tools(calls: Vec<ProposedCall>) -> ProposedDecision {
    ProposedDecision::ToolCalls { calls }
}

pub fn final_answer(answer: &str) -> ProposedDecision {
    ProposedDecision::Final {
        answer: answer.into(),
    }
}

pub fn output(json: &str) -> CallOutcome {
    CallOutcome::Output {
        output_json: json.into(),
    }
}

/// The order in which the fake tools report the results of a batch.
#[derive(Clone, Copy, Debug)]
pub enum Arrival {
    InOrder,
    Reversed,
}

/// The world around the engine. Every field is a fake the test controls.
pub struct World {
    /// Decision for each turn (1-based); past the end, `repeat_last` decides.
    pub script: Vec<Result<(ProposedDecision, Usage), String>>,
    pub repeat_last: bool,
    pub policy: Box<dyn FnMut(&[ToolCall]) -> Verdict>,
    pub tool: Box<dyn FnMut(&ToolCall) -> CallOutcome>,
    pub reconcile: Box<dyn FnMut(&ToolCall) -> Result<CallOutcome, String>>,
    pub verify: Box<dyn FnMut(&str) -> Verification>,
    /// Commits whose `expected_version` is listed fail.
    pub failing_commits: Vec<u64>,
    pub arrival: Arrival,
}

impl World {
    pub fn scripted(decisions: Vec<ProposedDecision>) -> World {
        World {
            script: decisions
                .into_iter()
                .map(|d| Ok((d, Usage::default())))
                .collect(),
            repeat_last: false,
            policy: Box::new(|_| Verdict::Allow),
            tool: Box::new(demo_tool),
            reconcile: Box::new(|call| Err(format!("no record of {}", call.call_id))),
            verify: Box::new(|_| Verification::Accepted),
            failing_commits: Vec::new(),
            arrival: Arrival::Reversed,
        }
    }

    fn decision(&self, turn: u32) -> Input {
        let index = usize::try_from(turn - 1).unwrap();
        let entry = self.script.get(index).or(if self.repeat_last {
            self.script.last()
        } else {
            None
        });
        match entry {
            Some(Ok((decision, usage))) => Input::Decided {
                decision: decision.clone(),
                usage: *usage,
            },
            Some(Err(message)) => Input::DecisionFailed {
                message: message.clone(),
            },
            None => Input::DecisionFailed {
                message: format!("the script has no turn {turn}"),
            },
        }
    }
}

/// The demo data of the seeds: `profile` = `active`, `policy` = `refund-under-100`.
pub fn demo_tool(call: &ToolCall) -> CallOutcome {
    let args: serde_json::Value = serde_json::from_str(&call.arguments_json).unwrap();
    match (call.tool.as_str(), args["key"].as_str()) {
        ("lookup", Some("profile")) => output(r#"{"key":"profile","value":"active"}"#),
        ("lookup", Some("policy")) => output(r#"{"key":"policy","value":"refund-under-100"}"#),
        ("lookup", _) => CallOutcome::Error(ToolError {
            error_type: ErrorType::NotFound,
            message: "no such key".into(),
            retryable: false,
            next_allowed_action: NextAction::FixArguments,
        }),
        _ => output(r#"{"ok":true}"#),
    }
}

/// Everything a run did.
pub struct Run {
    pub invocation: Invocation,
    pub outcome: Outcome,
    /// The committed log.
    pub log: Vec<Event>,
    /// Every action, in order.
    pub actions: Vec<Action>,
    /// Every call executed, in execution order.
    pub executed: Vec<ToolCall>,
    /// Every input fed, in order.
    pub inputs: Vec<Input>,
}

/// Drives `invocation` from `Start` to `Finish` against `world`. The clock stands still.
pub fn drive(invocation: Invocation, world: World) -> Run {
    drive_from(invocation, world, Vec::new())
}

/// Like [`drive`], on top of an already committed `log` (a restored invocation).
pub fn drive_from(mut invocation: Invocation, mut world: World, log: Vec<Event>) -> Run {
    let now = UnixMillis(0);
    let mut run = Run {
        outcome: Outcome {
            reason: TerminalReason::Completed,
            detail: String::new(),
            answer: None,
            totals: Totals::default(),
        },
        invocation: invocation.clone(),
        log,
        actions: Vec::new(),
        executed: Vec::new(),
        inputs: Vec::new(),
    };
    let mut inputs: VecDeque<Input> = VecDeque::from([Input::Start]);
    let mut finished = None;
    for _ in 0..100_000 {
        let Some(input) = inputs.pop_front() else {
            break;
        };
        run.inputs.push(input.clone());
        let actions = invocation
            .step(input, now)
            .expect("the harness only sends expected inputs");
        for action in &actions {
            match action {
                Action::Decide { turn } => inputs.push_back(world.decision(*turn)),
                Action::Authorize { calls, .. } => {
                    inputs.push_back(Input::Authorized((world.policy)(calls)))
                }
                Action::Execute { calls, .. } => {
                    let mut order: Vec<&ToolCall> = calls.iter().collect();
                    if matches!(world.arrival, Arrival::Reversed) {
                        order.reverse();
                    }
                    for call in order {
                        run.executed.push(call.clone());
                        let outcome = (world.tool)(call);
                        inputs.push_back(Input::CallFinished {
                            call_id: call.call_id.clone(),
                            outcome,
                        });
                    }
                }
                Action::Reconcile { calls, .. } => {
                    for call in calls {
                        inputs.push_back(match (world.reconcile)(call) {
                            Ok(outcome) => Input::Reconciled {
                                call_id: call.call_id.clone(),
                                outcome,
                            },
                            Err(detail) => Input::ReconciliationFailed {
                                call_id: call.call_id.clone(),
                                detail,
                            },
                        });
                    }
                }
                Action::CancelCalls { .. } => {}
                Action::Verify { answer, .. } => {
                    inputs.push_back(Input::Verified((world.verify)(answer)))
                }
                Action::Commit {
                    expected_version,
                    events,
                } => {
                    assert_eq!(
                        *expected_version,
                        run.log.last().map_or(0, |e| e.seq),
                        "commits extend the log"
                    );
                    if world.failing_commits.contains(expected_version) {
                        inputs.push_back(Input::CommitFailed {
                            message: "disk full".into(),
                        });
                    } else {
                        run.log.extend(events.iter().cloned());
                        inputs.push_back(Input::Committed);
                    }
                }
                Action::Finish(outcome) => {
                    assert!(finished.is_none(), "Finish is emitted once");
                    finished = Some(outcome.clone());
                }
            }
        }
        run.actions.extend(actions);
    }
    run.outcome = finished.expect("every run ends with Finish");
    run.invocation = invocation;
    run
}

/// Turn records of a log.
pub fn turns(log: &[Event]) -> Vec<&TurnRecord> {
    log.iter()
        .filter_map(|event| match &event.body {
            EventBody::Turn(record) => Some(record),
            EventBody::Ended(_) => None,
        })
        .collect()
}
