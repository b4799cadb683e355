//! Test support for agentloop: a synchronous, in-memory shell around the pure turn
//! engine. [`drive`] runs an invocation from `Start` to `Finish` against a [`World`] of
//! fakes (a scripted model, fake tools, policy, validators and a log that can refuse
//! commits) and returns everything that happened as a [`Run`]. [`conformance`] runs the
//! conformance suites of the backend crates (event store, leases, ledger).
//!
//! It is for tests and benchmarks only: nothing here does I/O, and every broken
//! expectation panics, because in a test that is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![warn(missing_docs)]

pub mod conformance;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use agentloop_engine::*;

/// The demo executor's tools: read-only `lookup` and `sleep`, and the `transfer` write.
pub fn catalog() -> Arc<ToolCatalog> {
    Arc::new(
        ToolCatalog::new()
            .with("lookup", ToolSpec::read_only())
            .with("sleep", ToolSpec::read_only())
            .with("transfer", ToolSpec::new(SideEffect::Write)),
    )
}

/// A proposed call.
pub fn call(id: &str, tool: &str, arguments: &str) -> ProposedCall {
    ProposedCall {
        call_id: id.into(),
        tool: tool.into(),
        arguments_json: arguments.into(),
    }
}

/// A proposed `lookup` of `key`.
pub fn lookup(id: &str, key: &str) -> ProposedCall {
    call(id, "lookup", &format!(r#"{{"key":"{key}"}}"#))
}

/// A proposed batch.
pub fn tools(calls: Vec<ProposedCall>) -> ProposedDecision {
    ProposedDecision::ToolCalls { calls }
}

/// A proposed final answer.
pub fn final_answer(answer: &str) -> ProposedDecision {
    ProposedDecision::Final {
        answer: answer.into(),
        evidence: Vec::new(),
    }
}

/// A successful call outcome.
pub fn output(json: &str) -> CallOutcome {
    CallOutcome::Output {
        output_json: json.into(),
    }
}

/// The order in which the fake tools report the results of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// In call order.
    InOrder,
    /// Last call first: shows that correlation does not rely on arrival order.
    Reversed,
}

/// Policy's answer to a batch.
pub type Policy = Box<dyn FnMut(&[ToolCall]) -> Verdict>;
/// A fake tool executor.
pub type Tool = Box<dyn FnMut(&ToolCall) -> CallOutcome>;
/// A fake executor's `Reconcile`: the outcome its records show, or why it cannot tell.
pub type Reconciler = Box<dyn FnMut(&ToolCall) -> Result<CallOutcome, String>>;
/// The verification of a final answer, given the answer and the call IDs it cites.
pub type Validator = Box<dyn FnMut(&str, &[CallId]) -> Verification>;

/// The world around the engine. Every field is a fake the test controls.
pub struct World {
    /// What the model answers on each turn (index 0 is turn 1): a decision with its
    /// usage, or a model error. Past the end, `repeat_last` decides.
    pub script: Vec<Result<(ProposedDecision, Usage), String>>,
    /// Repeat the last entry of `script` forever instead of failing with a model error.
    pub repeat_last: bool,
    /// Policy.
    pub policy: Policy,
    /// The tools.
    pub tool: Tool,
    /// Reconciliation of unknown write outcomes.
    pub reconcile: Reconciler,
    /// The final-answer validators.
    pub verify: Validator,
    /// Commits whose `expected_version` is listed fail.
    pub failing_commits: Vec<u64>,
    /// The order in which results of a batch arrive.
    pub arrival: Arrival,
}

impl fmt::Debug for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("World")
            .field("script", &self.script)
            .field("repeat_last", &self.repeat_last)
            .field("failing_commits", &self.failing_commits)
            .field("arrival", &self.arrival)
            .finish_non_exhaustive()
    }
}

impl World {
    /// A world where the model answers `decisions` with no token usage, policy allows
    /// everything, tools serve the demo data, answers are accepted and commits succeed.
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
            verify: Box::new(|_, _| Verification::Accepted { checks: Vec::new() }),
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

/// The demo's data: `profile` = `active`, `policy` = `refund-under-100`; any other
/// key is a structured `not_found` error. Every other tool answers `{"ok":true}`.
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

/// The output of a fake tool that asked a person and was sent `answer`:
/// `{"action":…,"content":…}`, the content as given (`null` when none).
pub fn answered(answer: &InputAnswer) -> String {
    let content = if answer.content_json.is_empty() {
        "null"
    } else {
        &answer.content_json
    };
    format!(
        r#"{{"action":"{}","content":{content}}}"#,
        answer.action.as_str()
    )
}

/// A fake tool's question: `which account?`, answered by an object with a string
/// `answer`.
pub fn asks() -> CallOutcome {
    CallOutcome::InputRequired(Box::new(InputRequest {
        message: "which account?".into(),
        schema_json:
            r#"{"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]}"#
                .into(),
    }))
}

/// Everything a run did.
#[derive(Debug)]
pub struct Run {
    /// The engine state at the end.
    pub invocation: Invocation,
    /// How it ended.
    pub outcome: Outcome,
    /// The committed log.
    pub log: Vec<Event>,
    /// Every action, in order.
    pub actions: Vec<Action>,
    /// Every call executed, in execution order.
    pub executed: Vec<ToolCall>,
}

/// Drives `invocation` from `Start` to `Finish` against `world`. The clock stands still.
pub fn drive(invocation: Invocation, world: World) -> Run {
    drive_from(invocation, world, Vec::new())
}

/// Like [`drive`], for an invocation restored from `log` (its committed events).
pub fn drive_from(invocation: Invocation, mut world: World, log: Vec<Event>) -> Run {
    run_on(invocation, &mut world, log, Vec::new(), Vec::new())
}

/// A fake human's reply to one wait: yes approves the proposal (or answers "yes", or
/// accepts a tool's question with `{"answer":"yes"}`), no denies it (or answers "no", or
/// declines the tool's question).
pub type Human = bool;

/// Drives an invocation restored from `log` to its end, replying to each wait for a
/// human with the next of `humans`, as the orchestrator's API does: the reply's event
/// follows the waiting end, and the invocation runs again, restored from its log. Stops
/// at a final end, or at a wait when no human is left.
pub fn drive_with_humans(
    limits: Limits,
    catalog: Arc<ToolCatalog>,
    mut world: World,
    mut log: Vec<Event>,
    humans: &[Human],
) -> Run {
    let mut humans = humans.iter().copied();
    let mut actions = Vec::new();
    let mut executed = Vec::new();
    loop {
        if let Some(Event {
            seq,
            body: EventBody::Ended(end),
        }) = log.last()
        {
            let next = humans.next().filter(|_| end.waits());
            let Some(yes) = next else {
                // Over, or waiting with nobody left to reply.
                let invocation = Invocation::restore(limits, catalog, &log).unwrap();
                let outcome = invocation.outcome().cloned().unwrap();
                return Run {
                    invocation,
                    outcome,
                    log,
                    actions,
                    executed,
                };
            };
            let reply_of = if end.reason == TerminalReason::ApprovalRequired {
                Reply::Resolve {
                    proposal: end.proposal.unwrap(),
                    approved: yes,
                    actor: "approver".into(),
                    comment: String::new(),
                }
            } else if end.input.is_some() {
                // A tool's question: yes accepts with content, no declines.
                Reply::Answer {
                    answer: if yes { r#"{"answer":"yes"}"# } else { "" }.into(),
                    actor: "user".into(),
                    action: Some(if yes {
                        InputAction::Accept
                    } else {
                        InputAction::Decline
                    }),
                }
            } else {
                Reply::Answer {
                    answer: if yes { "yes" } else { "no" }.into(),
                    actor: "user".into(),
                    action: None,
                }
            };
            let body = reply(end, reply_of, UnixMillis(0)).unwrap();
            let seq = seq + 1;
            log.push(Event { seq, body });
        }
        let invocation = Invocation::restore(limits, Arc::clone(&catalog), &log).unwrap();
        let run = run_on(invocation, &mut world, log, actions, executed);
        let waits = matches!(
            run.log.last(),
            Some(Event { body: EventBody::Ended(end), .. }) if end.waits()
        );
        if !waits {
            return run;
        }
        (log, actions, executed) = (run.log, run.actions, run.executed);
    }
}

fn run_on(
    mut invocation: Invocation,
    world: &mut World,
    mut log: Vec<Event>,
    mut actions_seen: Vec<Action>,
    mut executed: Vec<ToolCall>,
) -> Run {
    let now = UnixMillis(0);
    let mut inputs: VecDeque<Input> = VecDeque::from([Input::Start]);
    let mut finished = None;
    // Bounded: a run that has not finished after this many inputs is an engine bug.
    for _ in 0..100_000 {
        let Some(input) = inputs.pop_front() else {
            break;
        };
        let actions = invocation
            .step(input, now)
            .expect("the harness only sends expected inputs");
        for action in &actions {
            match action {
                Action::Decide { turn } => inputs.push_back(world.decision(*turn)),
                Action::Authorize { calls, .. } => {
                    inputs.push_back(Input::Authorized((world.policy)(calls).into()))
                }
                Action::Execute {
                    calls,
                    refused,
                    answer,
                    ..
                } => {
                    let mut order: Vec<&ToolCall> = calls.iter().collect();
                    if world.arrival == Arrival::Reversed {
                        order.reverse();
                    }
                    for call in order {
                        let refusal = refused.iter().find(|r| r.call_id == call.call_id);
                        let outcome = match refusal {
                            // Not sent: nothing was executed.
                            Some(refusal) => refusal.outcome(),
                            None => {
                                executed.push(call.clone());
                                match answer.as_deref() {
                                    // A tool that asked a person answers with what it
                                    // was given.
                                    Some(answer) if answer.call_id == call.call_id => {
                                        output(&answered(answer))
                                    }
                                    Some(_) | None => (world.tool)(call),
                                }
                            }
                        };
                        inputs.push_back(Input::CallFinished {
                            call_id: call.call_id.clone(),
                            outcome,
                        });
                    }
                }
                Action::Reconcile { calls, .. } => {
                    for call in calls {
                        let call_id = call.call_id.clone();
                        inputs.push_back(match (world.reconcile)(call) {
                            Ok(outcome) => Input::Reconciled { call_id, outcome },
                            Err(detail) => Input::ReconciliationFailed { call_id, detail },
                        });
                    }
                }
                // The fakes answer at once: by the time a cancel could arrive, nothing runs.
                Action::CancelCalls { .. } => {}
                Action::Verify {
                    answer, evidence, ..
                } => inputs.push_back(Input::Verified((world.verify)(answer, evidence))),
                Action::Commit {
                    expected_version,
                    events,
                    ..
                } => {
                    let version = log.last().map_or(0, |e: &Event| e.seq);
                    assert_eq!(*expected_version, version, "commits extend the log");
                    if world.failing_commits.contains(expected_version) {
                        inputs.push_back(Input::CommitFailed {
                            message: "disk full".into(),
                        });
                    } else {
                        log.extend(events.iter().cloned());
                        inputs.push_back(Input::Committed);
                    }
                }
                Action::Finish(outcome) => {
                    assert!(finished.is_none(), "Finish is emitted once");
                    finished = Some(outcome.clone());
                }
            }
        }
        actions_seen.extend(actions);
    }
    Run {
        invocation,
        outcome: finished.expect("every run ends with Finish"),
        log,
        actions: actions_seen,
        executed,
    }
}

/// The turn records of a log.
pub fn turns(log: &[Event]) -> Vec<&TurnRecord> {
    log.iter()
        .filter_map(|event| match &event.body {
            EventBody::Turn(record) => Some(record),
            EventBody::BatchStarted(_)
            | EventBody::Ended(_)
            | EventBody::ApprovalResolved(_)
            | EventBody::ClarificationAnswered(_) => None,
        })
        .collect()
}
