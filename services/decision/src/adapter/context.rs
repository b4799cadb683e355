//! The provider-neutral prompt built from one turn's `Question`: the goal, the summary of
//! what came before the window, and the window's committed events, where the last few
//! turns are shown in full and older ones as one-line notes. It only ever reads what
//! the request carries (itself bounded by the orchestrator, and again here), so the
//! cost of a turn does not grow with the length of the invocation.

use std::collections::HashSet;
use std::fmt::Write as _;

use agentloop_engine::DecisionBounds;
use agentloop_proto::v1::decision::{Final, Kind};
use agentloop_proto::v1::event::Body;
use agentloop_proto::v1::tool_result::Outcome as ResultOutcome;
use agentloop_proto::v1::{
    ApprovalVerdict, InputAction, Refusal, Rejection, RejectionKind, ToolCall, ToolResult,
    TurnCommitted,
};

use crate::model::Question;

/// Most history events read from one request, whatever the caller sends.
pub const MAX_HISTORY_EVENTS: usize = 64;

const DEFAULT_SYSTEM_PROMPT: &str = "You are an agent working towards the user's goal. \
Use the provided tools when you need information or need to act; you may call several \
independent tools at once. Tool results come back in the following messages. When the goal \
is reached, reply with the final answer as plain text and no tool call. If the goal cannot \
be reached, say why in plain text.";

/// Added to every system prompt, a configured one too: the adapters parse this line
/// (`super::split_evidence`), and an answer that cites nothing may not be accepted.
const EVIDENCE_INSTRUCTION: &str = "End a final answer with one last line \
`Evidence: <call IDs, comma-separated>` naming the tool calls whose results the answer \
rests on, by their call IDs, or `Evidence: none` when it rests on none.";

/// How the prompt is bounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContextConfig {
    pub(crate) keep_last_turns: usize,
    pub(crate) max_observation_bytes: usize,
    pub(crate) system_prompt: Option<String>,
}

/// One tool result as the model sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Observation {
    pub(crate) call_id: String,
    pub(crate) content: String,
    pub(crate) is_error: bool,
}

/// One message of the neutral conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Item {
    /// User-role text: the goal, notes, rejections, a user's answer.
    User(String),
    /// Assistant-role text: an answer or question proposed earlier.
    Assistant(String),
    /// Assistant tool calls, then one observation per call, in call order.
    Calls {
        calls: Vec<ToolCall>,
        observations: Vec<Observation>,
    },
}

/// The neutral prompt; each adapter renders it in its provider's format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Prompt {
    pub(crate) system: String,
    pub(crate) items: Vec<Item>,
}

/// Cuts `text` to at most `limit` bytes (at a character boundary), saying how much went.
pub(crate) fn truncate(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let kept = agentloop_proto::prefix(text, limit);
    format!("{kept}…[{} more bytes elided]", text.len() - kept.len())
}

fn non_empty(text: &str, fallback: &str) -> String {
    if text.trim().is_empty() {
        fallback.to_owned()
    } else {
        text.to_owned()
    }
}

pub(crate) fn build(request: &Question<'_>, config: &ContextConfig) -> Prompt {
    let limit = config.max_observation_bytes;
    let mut items = vec![Item::User(non_empty(
        &truncate(request.goal, limit.saturating_mul(4)),
        "(no goal given)",
    ))];
    let start = request.history.len().saturating_sub(MAX_HISTORY_EVENTS);
    let history = &request.history[start..];
    if !request.summary.is_empty() || request.context_from_seq > 1 || start > 0 {
        let summary = if request.summary.is_empty() {
            "no summary".to_owned()
        } else {
            truncate(request.summary, limit)
        };
        items.push(Item::User(format!(
            "[Earlier events before seq {} are not shown; summary: {summary}]",
            history.first().map_or(request.context_from_seq, |e| e.seq)
        )));
    }
    let turns = history
        .iter()
        .filter(|e| matches!(e.body, Some(Body::Turn(_))))
        .count();
    let elide_below = turns.saturating_sub(config.keep_last_turns);
    let mut turn_index = 0usize;
    let mut elided = String::new();
    // A turn reopened by an answer to its tool's question is committed again with the
    // new result: the model reads its last commit only.
    let reopened = |index: usize, turn: &TurnCommitted| {
        let asked = turn
            .results
            .iter()
            .any(|r| matches!(r.outcome, Some(ResultOutcome::InputRequired(_))));
        asked
            && history[index + 1..]
                .iter()
                .find_map(|e| match &e.body {
                    Some(Body::Turn(next)) => Some(next.turn),
                    _ => None,
                })
                .is_some_and(|next| next == turn.turn)
    };
    for (index, event) in history.iter().enumerate() {
        let Some(body) = &event.body else { continue };
        match body {
            Body::Turn(turn) if reopened(index, turn) => {}
            Body::Turn(turn) => {
                turn_index += 1;
                if turn_index <= elide_below {
                    if !elided.is_empty() {
                        elided.push_str("; ");
                    }
                    elided.push_str(&one_line(turn));
                    continue;
                }
                flush_elided(&mut items, &mut elided, limit);
                render_turn(&mut items, turn, limit);
            }
            Body::Ended(ended) => {
                flush_elided(&mut items, &mut elided, limit);
                let what = if ended.wait_until.is_some() {
                    "stopped to wait for a human"
                } else {
                    "stopped"
                };
                items.push(Item::User(format!(
                    "[The invocation {what} ({}{}{}) and was resumed.]",
                    ended.reason().as_str_name(),
                    if ended.detail.is_empty() { "" } else { ": " },
                    truncate(&ended.detail, 512)
                )));
            }
            // The same decision comes again, with its results, in the turn's `Turn`
            // event; the model needs it once.
            Body::BatchStarted(_) => {}
            Body::ApprovalResolved(resolved) => {
                flush_elided(&mut items, &mut elided, limit);
                let verdict = match resolved.verdict() {
                    ApprovalVerdict::Approve => "approved the proposal; its calls ran as proposed",
                    ApprovalVerdict::Deny => {
                        "denied the proposal; its calls did not run and will not be put to a \
                         human again"
                    }
                    ApprovalVerdict::Unspecified => "resolved the proposal",
                };
                let comment = if resolved.comment.is_empty() {
                    String::new()
                } else {
                    format!(" Their comment: {}", truncate(&resolved.comment, limit))
                };
                items.push(Item::User(format!(
                    "[A human ({}) {verdict}.{comment}]",
                    truncate(&resolved.actor, 128)
                )));
            }
            Body::ClarificationAnswered(answer) => {
                flush_elided(&mut items, &mut elided, limit);
                let said = match answer.action() {
                    InputAction::Unspecified => format!(
                        "The user answered your question: {}",
                        truncate(&answer.answer, limit)
                    ),
                    InputAction::Accept => format!(
                        "[The user answered the tool's question with {}; the call was sent \
                         again with it.]",
                        truncate(&answer.answer, limit)
                    ),
                    InputAction::Decline => "[The user declined to answer the tool's \
                                             question; the call was sent again saying so.]"
                        .to_owned(),
                    InputAction::Cancel => "[The user dismissed the tool's question; the \
                                            call was sent again saying so.]"
                        .to_owned(),
                };
                items.push(Item::User(said));
            }
        }
    }
    flush_elided(&mut items, &mut elided, limit);
    if !matches!(items.last(), Some(Item::User(_) | Item::Calls { .. })) {
        items.push(Item::User("Continue towards the goal.".into()));
    }
    let system = config
        .system_prompt
        .as_deref()
        .unwrap_or(DEFAULT_SYSTEM_PROMPT);
    Prompt {
        system: format!("{}\n\n{EVIDENCE_INSTRUCTION}", system.trim_end()),
        items,
    }
}

fn flush_elided(items: &mut Vec<Item>, elided: &mut String, limit: usize) {
    if !elided.is_empty() {
        items.push(Item::User(format!(
            "[Older turns, elided: {}]",
            truncate(elided, limit)
        )));
        elided.clear();
    }
}

/// An older turn in one line: what was decided and how it went.
fn one_line(turn: &TurnCommitted) -> String {
    let mut line = format!("turn {}: ", turn.turn);
    match turn.decision.as_ref().and_then(|d| d.kind.as_ref()) {
        Some(Kind::ToolCalls(calls)) => {
            let names: Vec<&str> = calls.calls.iter().map(|c| c.tool.as_str()).collect();
            let failed = turn
                .results
                .iter()
                .filter(|r| !matches!(r.outcome, Some(ResultOutcome::Output(_))))
                .count();
            let _ = write!(
                line,
                "called {} ({} results, {failed} not ok)",
                names.join(", "),
                turn.results.len()
            );
        }
        Some(Kind::Final(_)) => line.push_str("proposed a final answer"),
        Some(Kind::RequestApproval(_)) => line.push_str("asked for approval"),
        Some(Kind::Clarification(_)) => line.push_str("asked the user a question"),
        Some(Kind::CannotContinue(_)) => line.push_str("said it cannot continue"),
        None => line.push_str("no decision"),
    }
    if let Some(rejection) = &turn.rejection {
        let _ = write!(line, ", rejected: {}", truncate(&rejection.message, 160));
    }
    line
}

fn rejection_note(rejection: &Rejection, limit: usize) -> String {
    let kind = match rejection.kind() {
        RejectionKind::InvalidDecision => "it broke the protocol or was denied by policy",
        RejectionKind::VerificationFailed => "the answer failed verification",
        RejectionKind::Stopped => "the invocation stopped",
        RejectionKind::Unspecified => "rejected",
    };
    format!(
        "Your previous decision was not carried out ({kind}): {}. Correct it and decide again.",
        truncate(&rejection.message, limit)
    )
}

fn observation(result: Option<&ToolResult>, call_id: &str, limit: usize) -> Observation {
    let (content, is_error) = match result.and_then(|r| r.outcome.as_ref()) {
        Some(ResultOutcome::Output(output)) => (truncate(&output.output_json, limit), false),
        Some(ResultOutcome::Error(error)) => (
            serde_json::json!({
                "error": error.error_type().as_str_name(),
                "message": truncate(&error.message, limit),
                "retryable": error.retryable,
                "next_allowed_action": error.next_allowed_action().as_str_name(),
            })
            .to_string(),
            true,
        ),
        Some(ResultOutcome::Cancelled(c)) => (format!("cancelled: {}", c.reason), true),
        Some(ResultOutcome::NotStarted(n)) => (format!("not started: {}", n.reason), true),
        Some(ResultOutcome::Unknown(u)) => (format!("outcome unknown: {}", u.detail), true),
        Some(ResultOutcome::InputRequired(asked)) => (
            format!(
                "not finished: it asked the user {:?}, who did not answer",
                truncate(&asked.message, limit)
            ),
            true,
        ),
        None => ("not executed".to_owned(), true),
    };
    Observation {
        call_id: call_id.to_owned(),
        content: non_empty(&content, "(empty)"),
        is_error,
    }
}

/// What the model reads for a call policy refused: the refusal, structured like a
/// tool error, with the deciding policies' IDs.
fn refused(refusal: &Refusal, limit: usize) -> Observation {
    Observation {
        call_id: refusal.call_id.clone(),
        content: serde_json::json!({
            "error": refusal.error_type().as_str_name(),
            "message": truncate(&refusal.message, limit),
            "policies": refusal.policy_ids,
            "retryable": false,
        })
        .to_string(),
        is_error: true,
    }
}

fn render_turn(items: &mut Vec<Item>, turn: &TurnCommitted, limit: usize) {
    let refusals = turn
        .rejection
        .as_ref()
        .map_or(&[][..], |r| r.refusals.as_slice());
    let executed = |calls: &[ToolCall]| Item::Calls {
        calls: calls.to_vec(),
        observations: calls
            .iter()
            .map(|call| {
                let result = turn.results.iter().find(|r| r.call_id == call.call_id);
                match refusals.iter().find(|r| r.call_id == call.call_id) {
                    Some(refusal) if result.is_none() => refused(refusal, limit),
                    Some(_) | None => observation(result, &call.call_id, limit),
                }
            })
            .collect(),
    };
    match turn.decision.as_ref().and_then(|d| d.kind.as_ref()) {
        Some(Kind::ToolCalls(calls)) if !calls.calls.is_empty() => {
            items.push(executed(&calls.calls));
        }
        // The approved turn, committed again with the results of its calls.
        Some(Kind::RequestApproval(a)) if !turn.results.is_empty() => {
            items.push(executed(&a.calls));
        }
        Some(Kind::ToolCalls(_)) => {
            items.push(Item::Assistant("(an empty batch of tool calls)".into()))
        }
        Some(Kind::Final(f)) => items.push(Item::Assistant(answer_with_evidence(f, limit))),
        Some(Kind::RequestApproval(a)) => {
            let names: Vec<&str> = a.calls.iter().map(|c| c.tool.as_str()).collect();
            items.push(Item::Assistant(format!(
                "I asked for approval to call {}: {}",
                names.join(", "),
                truncate(&a.summary, limit)
            )));
        }
        Some(Kind::Clarification(c)) => items.push(Item::Assistant(non_empty(
            &truncate(&c.question, limit),
            "(empty question)",
        ))),
        Some(Kind::CannotContinue(c)) => items.push(Item::Assistant(non_empty(
            &truncate(&c.reason, limit),
            "(no reason)",
        ))),
        None => {}
    }
    if let Some(rejection) = &turn.rejection {
        items.push(Item::User(rejection_note(rejection, limit)));
    }
}

/// An earlier answer as the model wrote it, `Evidence:` line included, so that a repair
/// turn shows what it cited.
fn answer_with_evidence(answer: &Final, limit: usize) -> String {
    let cited = if answer.evidence.is_empty() {
        "none".to_owned()
    } else {
        answer.evidence.join(", ")
    };
    format!(
        "{}\n{} {}",
        non_empty(&truncate(&answer.answer, limit), "(empty answer)"),
        super::EVIDENCE_LABEL,
        truncate(&cited, limit)
    )
}

/// The call IDs already used in the request's window; a provider may not reuse them.
pub(crate) fn history_call_ids<'a>(request: &Question<'a>) -> HashSet<&'a str> {
    let start = request.history.len().saturating_sub(MAX_HISTORY_EVENTS);
    request.history[start..]
        .iter()
        .filter_map(|e| match &e.body {
            Some(Body::Turn(turn)) => turn.decision.as_ref(),
            Some(
                Body::Ended(_)
                | Body::BatchStarted(_)
                | Body::ApprovalResolved(_)
                | Body::ClarificationAnswered(_),
            )
            | None => None,
        })
        .flat_map(|d| match &d.kind {
            Some(Kind::ToolCalls(c)) => c.calls.as_slice(),
            Some(Kind::RequestApproval(a)) => a.calls.as_slice(),
            Some(Kind::Final(_) | Kind::Clarification(_) | Kind::CannotContinue(_)) | None => &[],
        })
        .map(|c| c.call_id.as_str())
        .collect()
}

/// The provider's call IDs, except that missing, oversized, repeated or already-used
/// ones become runtime IDs `call-<turn>-<index>`: the runtime correlates results by
/// these, so it never trusts the provider's blindly.
pub(crate) fn assign_ids(
    turn: u32,
    provider_ids: &[Option<&str>],
    used: &HashSet<&str>,
) -> Vec<String> {
    let max_call_id_bytes = DecisionBounds::default().max_call_id_bytes;
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = Vec::with_capacity(provider_ids.len());
    for (index, id) in provider_ids.iter().enumerate() {
        let usable = id.filter(|id| {
            !id.trim().is_empty()
                && id.len() <= max_call_id_bytes
                && !used.contains(id)
                && !seen.contains(*id)
                && provider_ids
                    .iter()
                    .filter(|other| *other == &Some(*id))
                    .count()
                    == 1
        });
        let id = match usable {
            Some(id) => id.to_owned(),
            None => {
                let mut candidate = format!("call-{turn}-{index}");
                let mut n = 0u32;
                while used.contains(candidate.as_str())
                    || seen.contains(&candidate)
                    || provider_ids.contains(&Some(candidate.as_str()))
                {
                    n += 1;
                    candidate = format!("call-{turn}-{index}-{n}");
                }
                candidate
            }
        };
        seen.insert(id.clone());
        out.push(id);
    }
    out
}

#[cfg(test)]
mod tests {
    use agentloop_proto::v1::DecideRequest;

    use super::*;

    /// A window wide enough for these histories.
    fn test_config() -> ContextConfig {
        ContextConfig {
            keep_last_turns: 8,
            max_observation_bytes: 4096,
            system_prompt: None,
        }
    }

    #[test]
    fn missing_repeated_and_reused_ids_become_runtime_ids() {
        let used: HashSet<&str> = ["old"].into_iter().collect();
        let ids = assign_ids(
            3,
            &[
                Some("a"),
                None,
                Some("dup"),
                Some("dup"),
                Some(""),
                Some("old"),
                Some("b"),
            ],
            &used,
        );
        assert_eq!(
            ids,
            [
                "a", "call-3-1", "call-3-2", "call-3-3", "call-3-4", "call-3-5", "b"
            ]
        );
    }

    #[test]
    fn an_approved_proposal_shows_its_results_and_who_approved() {
        use agentloop_proto::v1::{
            ApprovalResolved, Decision, InvocationEnded, ToolOutput, ToolResult, TurnCommitted,
            decision, event, tool_result,
        };
        let call = ToolCall {
            call_id: "t1".into(),
            tool: "transfer".into(),
            arguments_json: r#"{"amount":1}"#.into(),
        };
        let turn = |results: Vec<ToolResult>| TurnCommitted {
            turn: 1,
            decision: Some(Decision {
                kind: Some(decision::Kind::RequestApproval(decision::RequestApproval {
                    summary: "pay 1".into(),
                    calls: vec![call.clone()],
                })),
            }),
            results,
            ..Default::default()
        };
        let event = |seq, body| agentloop_proto::v1::Event {
            seq,
            body: Some(body),
            ..Default::default()
        };
        let output = ToolResult {
            call_id: "t1".into(),
            outcome: Some(tool_result::Outcome::Output(ToolOutput {
                output_json: r#"{"receipt":"r-1"}"#.into(),
                receipt: "r-1".into(),
            })),
        };
        let request = DecideRequest {
            goal: "pay".into(),
            turn: 2,
            history: vec![
                event(1, event::Body::Turn(turn(Vec::new()))),
                event(
                    2,
                    event::Body::Ended(InvocationEnded {
                        reason: 2,
                        wait_until: Some(Default::default()),
                        ..Default::default()
                    }),
                ),
                event(
                    3,
                    event::Body::ApprovalResolved(ApprovalResolved {
                        verdict: ApprovalVerdict::Approve.into(),
                        actor: "ana".into(),
                        comment: "ok for today".into(),
                        ..Default::default()
                    }),
                ),
                event(4, event::Body::Turn(turn(vec![output]))),
            ],
            ..Default::default()
        };
        let prompt = build(&Question::from(&request), &test_config());
        let text = format!("{:?}", prompt.items);
        assert!(
            text.contains("I asked for approval to call transfer"),
            "{text}"
        );
        assert!(text.contains("wait for a human"), "{text}");
        assert!(text.contains("A human (ana) approved"), "{text}");
        assert!(text.contains("ok for today"), "{text}");
        assert!(
            prompt.items.iter().any(|item| matches!(
                item,
                Item::Calls { observations, .. } if observations[0].content.contains("r-1")
            )),
            "the approved call's result reaches the model: {text}"
        );
    }

    #[test]
    fn a_turn_reopened_by_a_tools_question_is_read_once_with_its_answer() {
        use agentloop_proto::v1::{
            ClarificationAnswered, Decision, InvocationEnded, ToolOutput, ToolResult,
            TurnCommitted, decision, event, tool_result,
        };
        let call = ToolCall {
            call_id: "f1".into(),
            tool: "form".into(),
            arguments_json: "{}".into(),
        };
        let turn = |outcome| TurnCommitted {
            turn: 1,
            decision: Some(Decision {
                kind: Some(decision::Kind::ToolCalls(decision::ToolCalls {
                    calls: vec![call.clone()],
                })),
            }),
            results: vec![ToolResult {
                call_id: "f1".into(),
                outcome: Some(outcome),
            }],
            ..Default::default()
        };
        let event = |seq, body| agentloop_proto::v1::Event {
            seq,
            body: Some(body),
            ..Default::default()
        };
        let asked = tool_result::Outcome::InputRequired(tool_result::InputRequired {
            message: "which name?".into(),
            requested_schema_json: "{}".into(),
        });
        let answered = tool_result::Outcome::Output(ToolOutput {
            output_json: r#"{"name":"Ada"}"#.into(),
            receipt: String::new(),
        });
        let request = DecideRequest {
            goal: "fill the form".into(),
            turn: 2,
            history: vec![
                event(1, event::Body::Turn(turn(asked))),
                event(
                    2,
                    event::Body::Ended(InvocationEnded {
                        reason: 3,
                        detail: "which name?".into(),
                        wait_until: Some(Default::default()),
                        ..Default::default()
                    }),
                ),
                event(
                    3,
                    event::Body::ClarificationAnswered(ClarificationAnswered {
                        answer: r#"{"name":"Ada"}"#.into(),
                        actor: "ana".into(),
                        action: InputAction::Accept.into(),
                        ..Default::default()
                    }),
                ),
                event(4, event::Body::Turn(turn(answered))),
            ],
            ..Default::default()
        };
        let prompt = build(&Question::from(&request), &test_config());
        let text = format!("{:?}", prompt.items);
        let calls: Vec<&Item> = prompt
            .items
            .iter()
            .filter(|item| matches!(item, Item::Calls { .. }))
            .collect();
        assert_eq!(calls.len(), 1, "the call once: {text}");
        assert!(
            matches!(calls[0], Item::Calls { observations, .. } if observations[0].content.contains("Ada")),
            "{text}"
        );
        assert!(!text.contains("not finished"), "{text}");
        assert!(text.contains("answered the tool's question"), "{text}");
    }

    #[test]
    fn a_refused_call_reads_as_a_structured_refusal_naming_its_policies() {
        use agentloop_proto::v1::{Decision, ErrorType, decision, event};
        let call = |id: &str| ToolCall {
            call_id: id.into(),
            tool: "transfer".into(),
            arguments_json: r#"{"amount":1}"#.into(),
        };
        let turn = TurnCommitted {
            turn: 1,
            decision: Some(Decision {
                kind: Some(decision::Kind::ToolCalls(decision::ToolCalls {
                    calls: vec![call("t1"), call("t2")],
                })),
            }),
            rejection: Some(Rejection {
                kind: RejectionKind::InvalidDecision.into(),
                message: "call t1: permission denied by policy reserve".into(),
                refusals: vec![Refusal {
                    call_id: "t1".into(),
                    error_type: ErrorType::PermissionDenied.into(),
                    message: "permission denied by policy reserve".into(),
                    policy_ids: vec!["reserve".into()],
                }],
            }),
            ..Default::default()
        };
        let request = DecideRequest {
            goal: "pay".into(),
            turn: 2,
            history: vec![agentloop_proto::v1::Event {
                seq: 1,
                body: Some(event::Body::Turn(turn)),
                ..Default::default()
            }],
            ..Default::default()
        };
        let prompt = build(&Question::from(&request), &test_config());
        let Some(Item::Calls { observations, .. }) = prompt
            .items
            .iter()
            .find(|item| matches!(item, Item::Calls { .. }))
        else {
            panic!("the refused batch is shown: {:?}", prompt.items);
        };
        let refusal: serde_json::Value = serde_json::from_str(&observations[0].content).unwrap();
        assert_eq!(refusal["error"], "ERROR_TYPE_PERMISSION_DENIED");
        assert_eq!(refusal["policies"], serde_json::json!(["reserve"]));
        assert!(observations[0].is_error);
        assert_eq!(observations[1].content, "not executed");
    }

    #[test]
    fn an_earlier_answer_comes_back_with_its_evidence_line() {
        use agentloop_proto::v1::{Decision, event};
        let answered = |evidence: Vec<String>| DecideRequest {
            goal: "tier?".into(),
            turn: 2,
            history: vec![agentloop_proto::v1::Event {
                seq: 1,
                body: Some(event::Body::Turn(TurnCommitted {
                    turn: 1,
                    decision: Some(Decision {
                        kind: Some(Kind::Final(Final {
                            answer: "Gold.".into(),
                            evidence,
                        })),
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        };
        let assistant = |request: &DecideRequest| {
            build(&Question::from(request), &test_config())
                .items
                .into_iter()
                .find_map(|item| match item {
                    Item::Assistant(text) => Some(text),
                    Item::User(_) | Item::Calls { .. } => None,
                })
        };
        assert_eq!(
            assistant(&answered(vec!["c1".into(), "c2".into()])).as_deref(),
            Some("Gold.\nEvidence: c1, c2")
        );
        assert_eq!(
            assistant(&answered(Vec::new())).as_deref(),
            Some("Gold.\nEvidence: none")
        );
    }

    #[test]
    fn truncate_keeps_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h…[5 more bytes elided]");
        assert_eq!(truncate("abc", 3), "abc");
    }
}
