//! What the CLI shows: the committed event log as a timeline, and the summary of a run,
//! both as text for people and as JSON (`--json`) for scripts. The JSON shapes are a
//! stable external format.

use std::fmt::Write as _;

use agentloop_engine::{CheckKind, CheckVerdict, TerminalReason};
use agentloop_proto::v1 as pb;
use agentloop_wire as wire;
use serde::Serialize;

/// One committed event, flattened for JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventView {
    /// Position in the log.
    pub seq: u64,
    /// Commit time, milliseconds since the epoch.
    pub committed_at_ms: i64,
    /// `turn`, `batch_started`, `waiting` (the run stopped for a human),
    /// `approval_resolved`, `clarification_answered` or `ended`.
    pub kind: &'static str,
    /// Turn number (turns only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    /// The decision kind (turns only): final, tool_calls, request_approval,
    /// clarification, cannot_continue, or unparseable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<&'static str>,
    /// The answer, question or reason the decision carried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The call IDs a final answer cites.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    /// What each acceptance rule and verifier said of a refused final answer.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckView>,
    /// The calls and their results, in call order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<CallView>,
    /// Why the decision was not carried out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejection: Option<String>,
    /// Terminal reason (ended only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Detail of the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The accepted answer (ended `completed` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The rules and verifiers that accepted it (ended `completed` only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub accepted_by: Vec<CheckView>,
}

/// One check of a final answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckView {
    /// The rule's or verifier's name.
    pub name: String,
    /// `rule` or `verifier`.
    pub kind: &'static str,
    /// `accepted`, `rejected` or `undecided`.
    pub verdict: &'static str,
    /// Why, when not accepted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// What the verdict rests on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
}

impl CheckView {
    /// The view of a wire check.
    pub fn of(check: &pb::Check) -> CheckView {
        let check = wire::check_from(check.clone());
        CheckView {
            kind: match check.kind {
                CheckKind::Rule => "rule",
                CheckKind::Verifier => "verifier",
            },
            verdict: match check.verdict {
                CheckVerdict::Accepted => "accepted",
                CheckVerdict::Rejected => "rejected",
                CheckVerdict::Undecided => "undecided",
            },
            name: check.name,
            reasons: check.reasons,
            evidence: check.evidence,
        }
    }

    /// `name (evidence, ...)`, for one line.
    fn render(&self) -> String {
        if self.evidence.is_empty() {
            self.name.clone()
        } else {
            format!("{} ({})", self.name, self.evidence.join(", "))
        }
    }
}

fn views(checks: &[pb::Check]) -> Vec<CheckView> {
    checks.iter().map(CheckView::of).collect()
}

/// One call of a turn.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallView {
    /// The call ID.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The arguments as sent.
    pub arguments: String,
    /// output, error, cancelled, not_started, unknown, or none (not executed).
    pub outcome: &'static str,
    /// The output JSON, the error message or the unknown detail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// An invocation's state as people read it: `running`, `waiting: <reason>`,
/// `ended: <reason>`.
pub fn state_name(invocation: &pb::Invocation) -> String {
    match invocation.state() {
        pb::InvocationState::Running | pb::InvocationState::Pending => "running".into(),
        pb::InvocationState::Waiting => {
            format!("waiting: {}", wire::reason_name(invocation.terminal_reason))
        }
        pb::InvocationState::Ended | pb::InvocationState::Unspecified => {
            format!("ended: {}", wire::reason_name(invocation.terminal_reason))
        }
    }
}

/// One invocation in `agentloop list`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The invocation.
    pub invocation_id: String,
    /// As [`state_name`] gives it.
    pub state: String,
    /// Its tenant.
    pub tenant: String,
    /// When it was created, in milliseconds since the epoch.
    pub created_at_ms: i64,
    /// Turns committed.
    pub steps: u32,
    /// Tool calls that got a result.
    pub tool_calls: u32,
    /// The task, as given.
    pub goal: String,
}

impl Row {
    /// The row of `invocation`.
    pub fn of(invocation: &pb::Invocation) -> Row {
        let usage = invocation.usage.unwrap_or_default();
        Row {
            invocation_id: invocation.invocation_id.clone(),
            state: state_name(invocation),
            tenant: invocation.tenant.clone(),
            created_at_ms: millis(invocation.created_at.as_ref()),
            steps: usage.steps,
            tool_calls: usage.tool_calls,
            goal: invocation.goal.clone(),
        }
    }

    /// One line: the ID, the state, the turns and calls, the goal's start.
    pub fn render(&self) -> String {
        format!(
            "{}  {:<36}  steps={:<3} calls={:<3} {}",
            self.invocation_id,
            self.state,
            self.steps,
            self.tool_calls,
            one_line(&self.goal, 60)
        )
    }
}

/// The engine reason of a wire reason, if it is one.
pub fn reason_of(reason: i32) -> Option<TerminalReason> {
    pb::TerminalReason::try_from(reason)
        .ok()
        .and_then(wire::terminal_reason_from)
}

impl EventView {
    /// The view of a wire event.
    pub fn of(event: &pb::Event) -> EventView {
        let committed_at_ms = millis(event.committed_at.as_ref());
        let mut view = EventView {
            seq: event.seq,
            committed_at_ms,
            kind: "turn",
            turn: None,
            decision: None,
            text: None,
            evidence: Vec::new(),
            checks: Vec::new(),
            calls: Vec::new(),
            rejection: None,
            reason: None,
            detail: None,
            answer: None,
            accepted_by: Vec::new(),
        };
        match &event.body {
            Some(pb::event::Body::Turn(turn) | pb::event::Body::BatchStarted(turn)) => {
                let started = matches!(event.body, Some(pb::event::Body::BatchStarted(_)));
                if started {
                    view.kind = "batch_started";
                }
                view.turn = Some(turn.turn);
                view.rejection = turn.rejection.as_ref().map(|r| r.message.clone());
                let (decision, text, calls) = decision_parts(turn.decision.as_ref());
                view.decision = Some(decision);
                view.text = text;
                if let Some(pb::decision::Kind::Final(f)) =
                    turn.decision.as_ref().and_then(|d| d.kind.as_ref())
                {
                    view.evidence.clone_from(&f.evidence);
                }
                view.checks = views(&turn.checks);
                view.calls = calls
                    .iter()
                    .map(|call| {
                        let result = turn.results.iter().find(|r| r.call_id == call.call_id);
                        let (outcome, detail) = if started {
                            ("pending", None)
                        } else {
                            outcome_parts(result)
                        };
                        CallView {
                            call_id: call.call_id.clone(),
                            tool: call.tool.clone(),
                            arguments: call.arguments_json.clone(),
                            outcome,
                            detail,
                        }
                    })
                    .collect();
            }
            Some(pb::event::Body::Ended(ended)) => {
                view.kind = if ended.wait_until.is_some() {
                    "waiting"
                } else {
                    "ended"
                };
                view.reason = Some(wire::reason_name(ended.reason));
                view.detail = Some(ended.detail.clone()).filter(|d| !d.is_empty());
                view.answer = ended.answer.clone();
                view.accepted_by = views(&ended.accepted_by);
            }
            Some(pb::event::Body::ApprovalResolved(resolved)) => {
                view.kind = "approval_resolved";
                let verdict = match resolved.verdict() {
                    pb::ApprovalVerdict::Approve => "approved",
                    pb::ApprovalVerdict::Deny => "denied",
                    pb::ApprovalVerdict::Unspecified => "resolved",
                };
                let mut detail = format!("{verdict} by {}", resolved.actor);
                if !resolved.comment.is_empty() {
                    let _ = write!(detail, ": {}", resolved.comment);
                }
                view.detail = Some(detail);
            }
            Some(pb::event::Body::ClarificationAnswered(answered)) => {
                view.kind = "clarification_answered";
                view.detail = Some(answered.answer.clone());
            }
            None => view.kind = "unknown",
        }
        view
    }

    /// One or more lines of the timeline.
    pub fn render(&self) -> String {
        let mut out = String::new();
        match self.kind {
            "turn" | "batch_started" => {
                let _ = write!(
                    out,
                    "#{:<3} turn {:<3} {}{}",
                    self.seq,
                    self.turn.unwrap_or(0),
                    self.decision.unwrap_or("?"),
                    if self.kind == "batch_started" {
                        " (batch started: committed before its writes are sent)"
                    } else {
                        ""
                    }
                );
                if let Some(text) = &self.text {
                    let _ = write!(out, "  {}", one_line(text, 100));
                }
                if !self.evidence.is_empty() {
                    let _ = write!(out, "  [cites {}]", self.evidence.join(", "));
                }
                for call in &self.calls {
                    let _ = write!(
                        out,
                        "\n               {}({}) {}  -> {}",
                        call.tool,
                        call.call_id,
                        one_line(&call.arguments, 60),
                        call.outcome
                    );
                    if let Some(detail) = &call.detail {
                        let _ = write!(out, " {}", one_line(detail, 80));
                    }
                }
                if let Some(rejection) = &self.rejection {
                    let _ = write!(
                        out,
                        "\n               not carried out: {}",
                        one_line(rejection, 120)
                    );
                }
            }
            kind => {
                let _ = write!(
                    out,
                    "#{:<3} {kind:<8} {}",
                    self.seq,
                    self.reason.as_deref().unwrap_or("")
                );
                if let Some(detail) = &self.detail {
                    let _ = write!(out, "  {}", one_line(detail, 120));
                }
                if let Some(answer) = &self.answer {
                    let _ = write!(out, "\n               answer: {}", one_line(answer, 200));
                }
                if !self.accepted_by.is_empty() {
                    let accepted: Vec<String> =
                        self.accepted_by.iter().map(CheckView::render).collect();
                    let _ = write!(
                        out,
                        "\n               accepted by: {}",
                        one_line(&accepted.join("; "), 200)
                    );
                }
            }
        }
        out
    }
}

fn decision_parts(
    decision: Option<&pb::Decision>,
) -> (&'static str, Option<String>, &[pb::ToolCall]) {
    use pb::decision::Kind;
    match decision.and_then(|d| d.kind.as_ref()) {
        Some(Kind::Final(f)) => ("final", Some(f.answer.clone()), &[]),
        Some(Kind::ToolCalls(t)) => ("tool_calls", None, &t.calls),
        Some(Kind::RequestApproval(r)) => ("request_approval", Some(r.summary.clone()), &r.calls),
        Some(Kind::Clarification(c)) => ("clarification", Some(c.question.clone()), &[]),
        Some(Kind::CannotContinue(c)) => ("cannot_continue", Some(c.reason.clone()), &[]),
        None => ("unparseable", None, &[]),
    }
}

fn outcome_parts(result: Option<&pb::ToolResult>) -> (&'static str, Option<String>) {
    use pb::tool_result::Outcome;
    match result.and_then(|r| r.outcome.as_ref()) {
        Some(Outcome::Output(output)) => ("output", Some(output.output_json.clone())),
        Some(Outcome::Error(error)) => ("error", Some(error.message.clone())),
        Some(Outcome::Cancelled(_)) => ("cancelled", None),
        Some(Outcome::NotStarted(_)) => ("not_started", None),
        Some(Outcome::Unknown(unknown)) => ("unknown", Some(unknown.detail.clone())),
        Some(Outcome::InputRequired(asked)) => ("input_required", Some(asked.message.clone())),
        None => ("none", None),
    }
}

fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    }
}

/// What a waiting invocation waits for, and the commands that resume or end it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Waiting {
    /// The invocation.
    pub invocation_id: String,
    /// `approval_required` or `clarification_required`.
    pub reason: String,
    /// The proposal's summary, or the question.
    pub text: String,
    /// The digest an approval must name (approvals only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proposal_digest: Option<String>,
    /// The exact calls that run if approved (approvals only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<PendingCall>,
    /// The call that asked, when a tool asked the question.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<PendingInput>,
    /// Since when it waits, milliseconds since the epoch.
    pub since_ms: i64,
    /// When its wait bound passes, milliseconds since the epoch.
    pub until_ms: i64,
    /// The commands that resume it (or deny it), ready to run.
    pub commands: Vec<String>,
}

/// One call of a pending proposal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingCall {
    /// The call ID.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The canonical arguments, exactly as they would be sent.
    pub arguments: String,
}

/// The call whose tool asked a question, and what its answer must be.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingInput {
    /// The call ID.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The JSON Schema an accepted answer must satisfy (as the tool sent it).
    pub schema: serde_json::Value,
}

/// A protobuf timestamp in milliseconds since the epoch; 0 when absent.
fn millis(timestamp: Option<&prost_types::Timestamp>) -> i64 {
    timestamp.map_or(0, |t| {
        t.seconds.saturating_mul(1000) + i64::from(t.nanos / 1_000_000)
    })
}

impl Waiting {
    /// What `invocation` waits for, if it waits; `flags` are appended to each command
    /// (`--server URL`, `--data-dir DIR`).
    pub fn of(invocation: &pb::Invocation, flags: &str) -> Option<Waiting> {
        if invocation.state() != pb::InvocationState::Waiting {
            return None;
        }
        let id = &invocation.invocation_id;
        let (text, proposal_digest, calls, commands) =
            match (&invocation.pending_approval, &invocation.pending_question) {
                (Some(pending), _) => (
                    pending.summary.clone(),
                    Some(pending.proposal_digest.clone()),
                    pending
                        .calls
                        .iter()
                        .map(|call| PendingCall {
                            call_id: call.call_id.clone(),
                            tool: call.tool.clone(),
                            arguments: call.arguments_json.clone(),
                        })
                        .collect(),
                    vec![
                        format!(
                            "agentloop approve {id} --digest {}{flags}",
                            pending.proposal_digest
                        ),
                        format!("agentloop approve {id} --deny --comment \"why\"{flags}"),
                    ],
                ),
                (None, Some(question)) if invocation.pending_input.is_some() => (
                    question.clone(),
                    None,
                    Vec::new(),
                    vec![
                        format!("agentloop answer {id} '{{...}}'{flags}"),
                        format!("agentloop answer {id} --decline{flags}"),
                    ],
                ),
                (None, Some(question)) => (
                    question.clone(),
                    None,
                    Vec::new(),
                    vec![format!("agentloop answer {id} \"your answer\"{flags}")],
                ),
                (None, None) => return None,
            };
        let input = invocation.pending_input.as_ref().map(|input| PendingInput {
            call_id: input.call_id.clone(),
            tool: input.tool.clone(),
            // A schema that is not JSON is shown as the text it is.
            schema: serde_json::from_str(&input.requested_schema_json)
                .unwrap_or_else(|_| serde_json::Value::String(input.requested_schema_json.clone())),
        });
        Some(Waiting {
            invocation_id: id.clone(),
            reason: wire::reason_name(invocation.terminal_reason),
            text,
            proposal_digest,
            calls,
            input,
            since_ms: millis(invocation.waiting_since.as_ref()),
            until_ms: millis(invocation.wait_until.as_ref()),
            commands,
        })
    }

    /// The text form: what it waits for, the calls, the commands.
    pub fn render(&self) -> String {
        let mut out = match self.reason.as_str() {
            "approval_required" => format!(
                "invocation {} waits for an approval: {}",
                self.invocation_id, self.text
            ),
            _ => format!(
                "invocation {} waits for an answer: {}",
                self.invocation_id, self.text
            ),
        };
        if let Some(digest) = &self.proposal_digest {
            let _ = write!(out, "\n  proposal {digest}, {} call(s):", self.calls.len());
        }
        if let Some(input) = &self.input {
            let _ = write!(
                out,
                "\n  asked by {}({}); answer with a JSON object satisfying: {}",
                input.tool,
                input.call_id,
                one_line(&input.schema.to_string(), 400)
            );
        }
        for call in &self.calls {
            let _ = write!(
                out,
                "\n    {}({}) {}",
                call.tool,
                call.call_id,
                one_line(&call.arguments, 200)
            );
        }
        for command in &self.commands {
            let _ = write!(out, "\n  {command}");
        }
        out
    }
}

/// How a run ended, for the summary line and `--json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The invocation.
    pub invocation_id: String,
    /// Its terminal reason.
    pub reason: String,
    /// The accepted answer, if completed.
    pub answer: Option<String>,
    /// The detail of the end.
    pub detail: String,
    /// Turns taken.
    pub steps: u32,
    /// Tool calls executed.
    pub tool_calls: u32,
    /// Turn events committed.
    pub events: u32,
    /// Tokens used.
    pub input_tokens: u64,
    /// Tokens produced.
    pub output_tokens: u64,
    /// Wall-clock time of the run as the CLI saw it.
    pub elapsed_ms: u64,
    /// What it waits for, when it stopped to wait for a human.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Waiting>,
    /// The rules and verifiers that accepted the answer, if completed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub accepted_by: Vec<CheckView>,
}

impl Summary {
    /// The summary of an ended (or waiting) invocation, with the number of turn events
    /// seen; `flags` go into the commands that resume a waiting one.
    pub fn of(invocation: &pb::Invocation, events: u32, elapsed_ms: u64, flags: &str) -> Summary {
        let usage = invocation.usage.unwrap_or_default();
        Summary {
            invocation_id: invocation.invocation_id.clone(),
            reason: wire::reason_name(invocation.terminal_reason),
            answer: invocation.answer.clone(),
            detail: invocation.terminal_detail.clone(),
            steps: usage.steps,
            tool_calls: usage.tool_calls,
            events,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            elapsed_ms,
            waiting: Waiting::of(invocation, flags),
            accepted_by: views(&invocation.accepted_by),
        }
    }

    /// The text form: reason, answer (or detail), then the counters.
    pub fn render(&self) -> String {
        let mut out = self.reason.clone();
        match &self.answer {
            Some(answer) => {
                let _ = write!(out, "\n{answer}");
                if !self.accepted_by.is_empty() {
                    let accepted: Vec<String> =
                        self.accepted_by.iter().map(CheckView::render).collect();
                    let _ = write!(out, "\naccepted by: {}", accepted.join("; "));
                }
            }
            // Its detail is what `waiting` shows.
            None if self.waiting.is_some() => {}
            None if !self.detail.is_empty() => {
                let _ = write!(out, "\n{}", self.detail);
            }
            None => {}
        }
        let _ = write!(
            out,
            "\nsteps={} tool_calls={} events={}",
            self.steps, self.tool_calls, self.events
        );
        if let Some(waiting) = &self.waiting {
            let _ = write!(out, "\n{}", waiting.render());
        }
        out
    }
}
