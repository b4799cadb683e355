//! Fixtures: the invocations, events and appends the checks (and backends' own tests)
//! build on.

use agentloop_engine::{
    Answer, CallId, CallOutcome, CallResult, EndRecord, ErrorType, Event, EventBody, Fingerprint,
    MicroUsd, NextAction, ProposedCall, ProposedDecision, Rejection, RejectionKind, Resolution,
    TerminalReason, ToolError, Totals, TurnRecord, UnixMillis, Usage, Wait,
};
use uuid::Uuid;

use crate::{Append, Created, EventStore, InvocationRecord, NewInvocation};

/// A UUIDv7 for millisecond `ms`: larger `ms`, later in listings.
pub fn id_at(ms: u64) -> Uuid {
    let random: [u8; 10] = Uuid::new_v4().as_bytes()[..10]
        .try_into()
        .expect("ten bytes");
    uuid::Builder::from_unix_timestamp_millis(ms, &random).into_uuid()
}

/// The tenant of [`new_invocation`]'s invocations.
pub const TENANT: &str = "acme";

/// A new invocation of [`TENANT`] with ID `id_at(ms)`, created at `ms`.
pub fn new_invocation(ms: u64, key: Option<&str>, digest: &str) -> NewInvocation {
    NewInvocation {
        invocation_id: id_at(ms),
        tenant: TENANT.to_owned(),
        idempotency_key: key.map(str::to_owned),
        request_digest: digest.to_owned(),
        spec: format!(r#"{{"goal":"check {ms}","profile":"default"}}"#),
        created_at: UnixMillis(ms),
    }
}

fn lookup(id: &str, key: &str) -> ProposedCall {
    ProposedCall {
        call_id: id.to_owned(),
        tool: "lookup".to_owned(),
        arguments_json: format!(r#"{{"key":"{key}"}}"#),
    }
}

/// A typical turn: two `lookup` calls, their plan fingerprint and their two results.
pub fn lookup_turn(seq: u64, turn: u32) -> Event {
    let calls = vec![lookup("call-1", "alpha"), lookup("call-2", "beta")];
    let plan = Fingerprint::of_calls([
        ("lookup", r#"{"key":"alpha"}"#),
        ("lookup", r#"{"key":"beta"}"#),
    ]);
    Event {
        seq,
        body: EventBody::Turn(TurnRecord {
            turn,
            decision: ProposedDecision::ToolCalls { calls },
            usage: Usage {
                input_tokens: 1_200,
                output_tokens: 80,
                cost: Some(MicroUsd(2_500)),
            },
            plan: Some(plan),
            results: vec![
                CallResult {
                    call_id: CallId::new("call-1"),
                    outcome: CallOutcome::Output {
                        output_json: r#"{"key":"alpha","value":"first letter"}"#.to_owned(),
                    },
                },
                CallResult {
                    call_id: CallId::new("call-2"),
                    outcome: CallOutcome::Output {
                        output_json: r#"{"key":"beta","value":"second letter"}"#.to_owned(),
                    },
                },
            ],
            rejection: None,
            policy: None,
            checks: Vec::new(),
            // The contract version of the tool the calls ran under, kept as written.
            tools: [("lookup".to_owned(), agentloop_engine::ToolDigest([7; 16]))].into(),
        }),
    }
}

pub(super) fn turn(seq: u64, decision: ProposedDecision) -> Event {
    Event {
        seq,
        body: EventBody::Turn(TurnRecord {
            turn: u32::try_from(seq).unwrap_or(u32::MAX),
            decision,
            usage: Usage::default(),
            plan: None,
            results: Vec::new(),
            rejection: None,
            policy: None,
            checks: Vec::new(),
            tools: std::collections::BTreeMap::new(),
        }),
    }
}

pub(super) fn ended(seq: u64, reason: TerminalReason) -> Event {
    Event {
        seq,
        body: EventBody::Ended(EndRecord {
            reason,
            detail: format!("ended with {reason}"),
            answer: None,
            proposal: None,
            wait: None,
            accepted_by: Vec::new(),
        }),
    }
}

/// Every kind of event body, decision, call outcome and optional field, seq 1 onwards:
/// turns, a waiting `Ended`, two replies, and a final `Ended` last.
pub fn every_kind_of_event() -> Vec<Event> {
    let error = ToolError {
        error_type: ErrorType::Unavailable,
        message: "backend down".to_owned(),
        retryable: true,
        next_allowed_action: NextAction::Retry,
    };
    let calls = vec![
        lookup("a", "one"),
        lookup("b", "two"),
        lookup("c", "three"),
        lookup("d", "four"),
        lookup("e", "five"),
    ];
    let plan = Fingerprint::of_calls([("lookup", r#"{"key":"one"}"#)]);
    let mut events = vec![lookup_turn(1, 1)];
    events.push(Event {
        seq: 2,
        body: EventBody::Turn(TurnRecord {
            turn: 2,
            decision: ProposedDecision::ToolCalls {
                calls: calls.clone(),
            },
            usage: Usage {
                input_tokens: u64::from(u32::MAX) + 7,
                output_tokens: 3,
                cost: None,
            },
            plan: Some(plan),
            results: vec![
                CallResult {
                    call_id: CallId::new("a"),
                    outcome: CallOutcome::Output {
                        output_json: r#"{"unicode":"grüße ✓","n":12345678901234567890}"#.to_owned(),
                    },
                },
                CallResult {
                    call_id: CallId::new("b"),
                    outcome: CallOutcome::Error(error),
                },
                CallResult {
                    call_id: CallId::new("c"),
                    outcome: CallOutcome::Cancelled,
                },
                CallResult {
                    call_id: CallId::new("d"),
                    outcome: CallOutcome::NotStarted,
                },
                CallResult {
                    call_id: CallId::new("e"),
                    outcome: CallOutcome::Unknown {
                        detail: "timed out after 30 s".to_owned(),
                    },
                },
            ],
            rejection: None,
            policy: None,
            checks: Vec::new(),
            tools: std::collections::BTreeMap::new(),
        }),
    });
    events.push(Event {
        seq: 3,
        body: EventBody::Turn(TurnRecord {
            turn: 3,
            decision: ProposedDecision::Unparseable {
                text: "I think\n\"maybe\"".to_owned(),
            },
            usage: Usage::default(),
            plan: None,
            results: Vec::new(),
            rejection: Some(Rejection {
                kind: RejectionKind::InvalidDecision,
                message: "the model output is not a decision".to_owned(),
                refusals: Vec::new(),
            }),
            policy: None,
            checks: Vec::new(),
            tools: std::collections::BTreeMap::new(),
        }),
    });
    let decisions = [
        ProposedDecision::Final {
            answer: "wrong".to_owned(),
            evidence: Vec::new(),
        },
        ProposedDecision::Clarification {
            question: "which one?".to_owned(),
        },
        ProposedDecision::CannotContinue {
            reason: "no access".to_owned(),
        },
        ProposedDecision::RequestApproval {
            summary: "transfer 10".to_owned(),
            calls,
        },
    ];
    for decision in decisions {
        let seq = events.len() as u64 + 1;
        events.push(turn(seq, decision));
    }
    let seq = events.len() as u64 + 1;
    events.push(Event {
        seq,
        body: EventBody::Turn(TurnRecord {
            turn: 8,
            decision: ProposedDecision::Final {
                answer: "42".to_owned(),
                evidence: Vec::new(),
            },
            usage: Usage {
                input_tokens: 10,
                output_tokens: 2,
                cost: None,
            },
            plan: None,
            results: Vec::new(),
            rejection: Some(Rejection {
                kind: RejectionKind::Stopped,
                message: "approval gate".to_owned(),
                refusals: Vec::new(),
            }),
            policy: None,
            checks: Vec::new(),
            tools: std::collections::BTreeMap::new(),
        }),
    });
    let seq = events.len() as u64 + 1;
    events.push(Event {
        seq,
        body: EventBody::Ended(EndRecord {
            reason: TerminalReason::ApprovalRequired,
            detail: "needs a human".to_owned(),
            answer: Some("42".to_owned()),
            proposal: Some(plan),
            wait: Some(Wait {
                since: UnixMillis(5),
                until: UnixMillis(7),
            }),
            accepted_by: Vec::new(),
        }),
    });
    let seq = events.len() as u64 + 1;
    events.push(Event {
        seq,
        body: EventBody::ApprovalResolved(Resolution {
            proposal: plan,
            approved: false,
            actor: "ana".to_owned(),
            comment: "not this one".to_owned(),
            waited_ms: 2,
        }),
    });
    let seq = events.len() as u64 + 1;
    events.push(Event {
        seq,
        body: EventBody::ClarificationAnswered(Answer {
            answer: "the blue one".to_owned(),
            actor: "ana".to_owned(),
            waited_ms: 3,
        }),
    });
    let seq = events.len() as u64 + 1;
    events.push(ended(seq, TerminalReason::Cancelled));
    events
}

pub(super) fn totals(steps: u32) -> Totals {
    Totals {
        steps,
        tool_calls: steps * 2,
        input_tokens: u64::from(steps) * 100,
        output_tokens: u64::from(steps) * 10,
        turn_events: steps,
        cost: MicroUsd(u64::from(steps) * 2_500),
    }
}

/// An append of `events` after version `expected_version` under `lease_epoch`, with the
/// totals of that many turns and a commit time that grows with the version.
pub fn append_of(expected_version: u64, lease_epoch: u64, events: &[Event]) -> Append<'_> {
    Append {
        expected_version,
        lease_epoch,
        events,
        totals: totals(u32::try_from(expected_version).unwrap_or(0) + 1),
        committed_at: UnixMillis(1_000 + expected_version),
    }
}

pub(super) async fn create_new(store: &dyn EventStore, new: NewInvocation) -> InvocationRecord {
    match store.create(new).await {
        Ok(Created::New(record)) => record,
        other => panic!("expected Created::New, got {other:?}"),
    }
}

pub(super) async fn event_count(store: &dyn EventStore, id: Uuid) -> usize {
    store.events(id, 0, 10_000).await.expect("events").len()
}
