//! The behaviour every [`EventStore`] backend must show, as a test suite backends run.
//!
//! Each check is a `pub async fn` taking a fresh, empty store; [`run_all`] runs every
//! check in [`CHECKS`] on its own store (with the one runner of every suite,
//! [`agentloop_testkit::conformance::run_checks`]) and names the check that failed. A
//! backend's integration test needs only a factory:
//!
//! ```no_run
//! # async fn example() {
//! use agentloop_store::{SqliteStore, conformance};
//! conformance::run_all(|| async {
//!     let dir = tempfile::tempdir().unwrap();
//!     let store = SqliteStore::open_in(dir.path()).await.unwrap();
//!     (store, dir) // the guard (here the temp dir) lives as long as the check
//! })
//! .await;
//! # }
//! ```
//!
//! Checks must run inside a multi-threaded-capable Tokio runtime (one spawns tasks).
//! They assert only what the [`EventStore`] documentation promises, so PostgreSQL runs the
//! same functions.

// This module is a test suite shipped for backends: a broken expectation is reported by
// panicking, exactly as in a test.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use agentloop_engine::{
    Answer, CallId, CallOutcome, CallResult, EndRecord, ErrorType, Event, EventBody, Fingerprint,
    InputAction, InputRequest, MicroUsd, NextAction, PendingInput, ProposedCall, ProposedDecision,
    Rejection, RejectionKind, Resolution, TerminalReason, ToolError, Totals, TurnRecord,
    UnixMillis, Usage, Wait,
};
use agentloop_testkit::conformance::{Check, run_checks};
use uuid::Uuid;

use crate::{
    Append, Created, EventStore, InvocationRecord, InvocationState, ListRequest, NewInvocation,
    StoreError,
};

mod groups;
pub use groups::{
    a_broken_append_fails_alone, every_verdict_in_one_group, new_invocations, until_queued,
};

/// Every check, by name, in the order [`run_all`] runs them; each gets a fresh store.
pub const CHECKS: &[Check<Arc<dyn EventStore>>] = &[
    ("create_get_round_trip", |s| {
        Box::pin(create_get_round_trip(s))
    }),
    ("idempotent_create", |s| Box::pin(idempotent_create(s))),
    ("concurrent_creates_one_key", |s| {
        Box::pin(concurrent_creates_one_key(s))
    }),
    ("append_and_read_every_kind", |s| {
        Box::pin(append_and_read_every_kind(s))
    }),
    ("events_paging", |s| Box::pin(events_paging(s))),
    ("version_conflict", |s| Box::pin(version_conflict(s))),
    ("concurrent_appends_one_wins", |s| {
        Box::pin(concurrent_appends_one_wins(s))
    }),
    ("lease_epoch_fencing", |s| Box::pin(lease_epoch_fencing(s))),
    ("append_after_ended_refused", |s| {
        Box::pin(append_after_ended_refused(s))
    }),
    ("malformed_appends_write_nothing", |s| {
        Box::pin(malformed_appends_write_nothing(s))
    }),
    ("list_paging", |s| Box::pin(list_paging(s))),
    ("list_filters", |s| Box::pin(list_filters(s))),
    ("tenants_apart", |s| Box::pin(tenants_apart(s))),
    ("running_oldest_first", |s| {
        Box::pin(running_oldest_first(s))
    }),
    ("claim_fences_older_epochs", |s| {
        Box::pin(claim_fences_older_epochs(s))
    }),
    ("concurrent_claims_newest_wins", |s| {
        Box::pin(concurrent_claims_newest_wins(s))
    }),
    ("cancel_requests_are_durable", |s| {
        Box::pin(cancel_requests_are_durable(s))
    }),
    ("waits_for_humans", |s| Box::pin(waits_for_humans(s))),
    ("not_found", |s| Box::pin(not_found(s))),
];

/// Runs every check in [`CHECKS`], each on a store from `make`.
///
/// `make` returns the store and a guard dropped after the check (a temp dir, a database
/// to drop); a failing check panics with its name.
pub async fn run_all<S: EventStore, G>(mut make: impl AsyncFnMut() -> (S, G)) {
    let make = async || {
        let (store, guard) = make().await;
        (Arc::new(store) as Arc<dyn EventStore>, guard)
    };
    // `close` is not part of the trait: the store is dropped with its last `Arc`, and the
    // guard (a temp dir, `DROP DATABASE ... WITH (FORCE)`) copes with what it leaves open.
    run_checks("event store", CHECKS, make, async |_| {}).await;
}

// ---------------------------------------------------------------------------------------
// Fixtures.

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
            tools: [("lookup".to_owned(), agentloop_engine::ToolDigest([7; 16]))]
                .into_iter()
                .collect(),
            permits: vec![agentloop_engine::Permit {
                call_id: agentloop_engine::CallId::new("c1"),
                policies: vec!["lookups-for-everyone".into()],
            }],
        }),
    }
}

fn turn(seq: u64, decision: ProposedDecision) -> Event {
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
            tools: agentloop_engine::ToolDigests::default(),
            permits: Vec::new(),
        }),
    }
}

fn ended(seq: u64, reason: TerminalReason) -> Event {
    Event {
        seq,
        body: EventBody::Ended(EndRecord {
            reason,
            detail: format!("ended with {reason}"),
            answer: None,
            proposal: None,
            wait: None,
            accepted_by: Vec::new(),
            input: None,
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
                CallResult {
                    call_id: CallId::new("f"),
                    outcome: CallOutcome::InputRequired(Box::new(InputRequest {
                        message: "which account?".to_owned(),
                        schema_json: r#"{"type":"object"}"#.to_owned(),
                    })),
                },
            ],
            rejection: None,
            policy: None,
            checks: Vec::new(),
            tools: agentloop_engine::ToolDigests::default(),
            permits: Vec::new(),
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
            tools: agentloop_engine::ToolDigests::default(),
            permits: Vec::new(),
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
            tools: agentloop_engine::ToolDigests::default(),
            permits: Vec::new(),
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
            input: Some(Box::new(PendingInput {
                call_id: CallId::new("f"),
                tool: "lookup".to_owned(),
                schema_json: r#"{"type":"object"}"#.to_owned(),
            })),
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
            action: Some(InputAction::Accept),
        }),
    });
    let seq = events.len() as u64 + 1;
    events.push(ended(seq, TerminalReason::Cancelled));
    events
}

fn totals(steps: u32) -> Totals {
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

async fn create_new(store: &dyn EventStore, new: NewInvocation) -> InvocationRecord {
    match store.create(new).await {
        Ok(Created::New(record)) => record,
        other => panic!("expected Created::New, got {other:?}"),
    }
}

async fn event_count(store: &dyn EventStore, id: Uuid) -> usize {
    store.events(id, 0, 10_000).await.expect("events").len()
}

// ---------------------------------------------------------------------------------------
// Checks.

/// The invocation an upgrade test writes with an earlier release's schema, before it
/// upgrades: (idempotency key, request digest, spec).
pub const EARLIER_ROW: (&str, &str, &str) =
    ("key-1", "digest-1", r#"{"goal":"old","tenant":"acme"}"#);

/// Writes [`EARLIER_ROW`] into the invocations table of the schema before the spec moved
/// out of it, through `executor` (a SQLite or PostgreSQL connection: the statement is the
/// same in both), and returns the invocation's ID. The values are literals: the test's own
/// constants.
pub async fn write_earlier_row<'e, E: sqlx::Executor<'e>>(executor: E) -> Uuid {
    let (key, digest, spec) = EARLIER_ROW;
    let id = id_at(5_000);
    let totals = serde_json::to_string(&Totals::default()).unwrap();
    let insert = format!(
        "INSERT INTO invocations (invocation_id, idempotency_key, request_digest, spec, state, \
         version, lease_epoch, totals, end_record, created_at, updated_at) \
         VALUES ('{}', '{key}', '{digest}', '{spec}', 'running', 0, 0, '{totals}', NULL, \
         5000, 5000)",
        id.hyphenated()
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(insert))
        .execute(executor)
        .await
        .unwrap();
    id
}

/// After an upgrade: invocation `id`, written as [`EARLIER_ROW`] describes, is whole, its
/// key still finds it, and it takes appends.
pub async fn earlier_row_goes_on(store: &dyn EventStore, id: Uuid) {
    let (key, digest, spec) = EARLIER_ROW;
    let record = store.get(id).await.unwrap();
    assert_eq!(record.spec, spec);
    assert_eq!(record.tenant, TENANT, "the tenant comes from the spec");
    assert_eq!(record.request_digest, digest);
    assert_eq!(record.idempotency_key.as_deref(), Some(key));
    let mut again = new_invocation(6_000, Some(key), digest);
    again.spec = spec.to_owned();
    assert!(matches!(
        store.create(again).await.unwrap(),
        Created::Existing(existing) if existing.invocation_id == id
    ));
    store
        .append(id, append_of(0, 1, &[lookup_turn(1, 1)]))
        .await
        .unwrap();
    assert_eq!(store.get(id).await.unwrap().version, 1);
}

/// A created invocation reads back exactly, running at version 0.
pub async fn create_get_round_trip(store: Arc<dyn EventStore>) {
    let new = new_invocation(1_000, Some("key-1"), "digest-1");
    let created = create_new(&*store, new.clone()).await;
    assert_eq!(created.invocation_id, new.invocation_id);
    assert_eq!(created.idempotency_key, new.idempotency_key);
    assert_eq!(created.request_digest, new.request_digest);
    assert_eq!(created.spec, new.spec);
    assert_eq!(created.state, InvocationState::Running);
    assert_eq!((created.version, created.lease_epoch), (0, 0));
    assert_eq!(created.totals, Totals::default());
    assert_eq!(created.end, None);
    assert_eq!(created.created_at, new.created_at);
    assert_eq!(store.get(new.invocation_id).await.expect("get"), created);

    let without_key = new_invocation(1_001, None, "digest-1");
    let created = create_new(&*store, without_key.clone()).await;
    assert_eq!(created.idempotency_key, None);
    assert_eq!(
        store.get(without_key.invocation_id).await.expect("get"),
        created
    );
    assert!(
        store
            .events(without_key.invocation_id, 0, 10)
            .await
            .expect("events")
            .is_empty(),
        "a new invocation has no events"
    );
}

/// The same key and digest returns the stored invocation; a different digest conflicts;
/// invocations without a key never collide.
pub async fn idempotent_create(store: Arc<dyn EventStore>) {
    let first = create_new(&*store, new_invocation(1_000, Some("k"), "d1")).await;
    let events = [lookup_turn(1, 1)];
    store
        .append(first.invocation_id, append_of(0, 1, &events))
        .await
        .expect("append");
    let current = store.get(first.invocation_id).await.expect("get");

    let again = new_invocation(2_000, Some("k"), "d1");
    match store.create(again.clone()).await {
        Ok(Created::Existing(record)) => assert_eq!(record, current, "the stored record"),
        other => panic!("expected Created::Existing, got {other:?}"),
    }
    assert!(
        matches!(store.get(again.invocation_id).await, Err(StoreError::NotFound(id)) if id == again.invocation_id),
        "a repeated create stores nothing new"
    );

    match store.create(new_invocation(3_000, Some("k"), "d2")).await {
        Err(StoreError::IdempotencyConflict { key, existing }) => {
            assert_eq!(key, "k");
            assert_eq!(existing, first.invocation_id);
        }
        other => panic!("expected IdempotencyConflict, got {other:?}"),
    }

    create_new(&*store, new_invocation(4_000, Some("other"), "d1")).await;
    create_new(&*store, new_invocation(5_000, None, "d1")).await;
    create_new(&*store, new_invocation(6_000, None, "d1")).await;
    let all = store
        .list(ListRequest {
            limit: 100,
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(all.len(), 4);
}

/// Sixteen concurrent creates with one key: exactly one stores, the rest see it.
/// Repeated over several keys, because a race shows only now and then.
pub async fn concurrent_creates_one_key(store: Arc<dyn EventStore>) {
    const ROUNDS: u64 = 8;
    for round in 0..ROUNDS {
        let key = format!("shared-{round}");
        let mut tasks = tokio::task::JoinSet::new();
        for index in 0..16u64 {
            let store = Arc::clone(&store);
            let new = new_invocation(1_000 + round * 100 + index, Some(&key), "digest");
            tasks.spawn(async move { store.create(new).await });
        }
        let mut new_ids = Vec::new();
        let mut existing_ids = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            match joined.expect("task") {
                Ok(Created::New(record)) => new_ids.push(record.invocation_id),
                Ok(Created::Existing(record)) => existing_ids.push(record.invocation_id),
                Err(error) => panic!("a concurrent create failed: {error}"),
            }
        }
        assert_eq!(new_ids.len(), 1, "exactly one create stores (key {key})");
        assert_eq!(existing_ids.len(), 15);
        assert!(existing_ids.iter().all(|id| *id == new_ids[0]));
    }
    let all = store
        .list(ListRequest {
            limit: 100,
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(all.len() as u64, ROUNDS, "one invocation per key");
}

/// Every kind of event reads back exactly, and the invocation row follows the appends.
pub async fn append_and_read_every_kind(store: Arc<dyn EventStore>) {
    let record = create_new(&*store, new_invocation(1_000, None, "d")).await;
    let id = record.invocation_id;
    let events = every_kind_of_event();
    let (last, rest) = events.split_last().expect("events");
    let waits = rest
        .iter()
        .position(|e| matches!(&e.body, EventBody::Ended(end) if end.waits()))
        .expect("a waiting end");
    let (turns, replies) = rest.split_at(waits + 1);

    let first = Append {
        expected_version: 0,
        lease_epoch: 3,
        events: turns,
        totals: totals(7),
        committed_at: UnixMillis(5_000),
    };
    store.append(id, first).await.expect("append turns");
    let after = store.get(id).await.expect("get");
    assert_eq!(after.version, turns.len() as u64);
    assert_eq!(after.lease_epoch, 3);
    assert_eq!(after.totals, totals(7));
    assert_eq!(after.updated_at, UnixMillis(5_000));
    assert_eq!(after.created_at, record.created_at);
    // The turns end with a waiting end: the invocation waits, with that end.
    assert_eq!(after.state, InvocationState::Waiting);
    let EventBody::Ended(waiting) = &turns[waits].body else {
        panic!("a waiting end")
    };
    assert_eq!(after.end.as_ref(), Some(waiting));

    let resumed = Append {
        expected_version: turns.len() as u64,
        lease_epoch: 3,
        events: replies,
        totals: totals(7),
        committed_at: UnixMillis(5_500),
    };
    store.append(id, resumed).await.expect("append the replies");
    let after = store.get(id).await.expect("get");
    assert_eq!(after.state, InvocationState::Running);
    assert_eq!(after.end, None);

    let end = Append {
        expected_version: rest.len() as u64,
        lease_epoch: 3,
        events: std::slice::from_ref(last),
        totals: totals(8),
        committed_at: UnixMillis(6_000),
    };
    store.append(id, end).await.expect("append end");
    let after = store.get(id).await.expect("get");
    assert_eq!(after.version, events.len() as u64);
    assert_eq!(after.state, InvocationState::Ended);
    assert_eq!(after.totals, totals(8));
    assert_eq!(after.updated_at, UnixMillis(6_000));
    let EventBody::Ended(end_record) = &last.body else {
        panic!("the fixture ends with Ended");
    };
    assert_eq!(after.end.as_ref(), Some(end_record));

    let stored = store.events(id, 1, 1_000).await.expect("events");
    let read: Vec<Event> = stored.iter().map(|s| s.event.clone()).collect();
    assert_eq!(read, events, "events read back exactly, in order");
    let times: Vec<u64> = stored.iter().map(|s| s.committed_at.0).collect();
    let mut expected_times = vec![5_000; turns.len()];
    expected_times.extend(vec![5_500; replies.len()]);
    expected_times.push(6_000);
    assert_eq!(times, expected_times);
}

/// `from_seq` and `limit` page through the log; reading past the end is empty.
pub async fn events_paging(store: Arc<dyn EventStore>) {
    let id = create_new(&*store, new_invocation(1_000, None, "d"))
        .await
        .invocation_id;
    let events: Vec<Event> = (1..=5).map(|seq| lookup_turn(seq, seq as u32)).collect();
    store
        .append(id, append_of(0, 1, &events[..2]))
        .await
        .expect("append 1-2");
    store
        .append(id, append_of(2, 1, &events[2..]))
        .await
        .expect("append 3-5");
    let seqs = |page: Vec<crate::StoredEvent>| -> Vec<u64> {
        page.into_iter().map(|s| s.event.seq).collect()
    };
    assert_eq!(
        seqs(store.events(id, 0, 100).await.unwrap()),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(seqs(store.events(id, 2, 2).await.unwrap()), [2, 3]);
    assert_eq!(seqs(store.events(id, 4, 2).await.unwrap()), [4, 5]);
    assert_eq!(seqs(store.events(id, 5, 100).await.unwrap()), [5]);
    assert!(store.events(id, 6, 100).await.unwrap().is_empty());
    assert!(store.events(id, u64::MAX, 100).await.unwrap().is_empty());
    assert!(store.events(id, 1, 0).await.unwrap().is_empty());
}

/// An append that does not extend the current version is refused and writes nothing.
pub async fn version_conflict(store: Arc<dyn EventStore>) {
    let id = create_new(&*store, new_invocation(1_000, None, "d"))
        .await
        .invocation_id;
    store
        .append(id, append_of(0, 1, &[lookup_turn(1, 1)]))
        .await
        .expect("append");
    for expected in [0u64, 2, 7] {
        let events = [lookup_turn(expected + 1, 9)];
        match store.append(id, append_of(expected, 1, &events)).await {
            Err(StoreError::VersionConflict {
                invocation_id,
                expected: e,
                actual,
            }) => {
                assert_eq!(invocation_id, id);
                assert_eq!(e, expected);
                assert_eq!(actual, 1);
            }
            other => panic!("expected VersionConflict at {expected}, got {other:?}"),
        }
    }
    let record = store.get(id).await.expect("get");
    assert_eq!(record.version, 1);
    assert_eq!(
        record.totals,
        totals(1),
        "a refused append leaves the totals"
    );
    assert_eq!(event_count(&*store, id).await, 1);
}

/// Writers extending the same version at once: exactly one succeeds each time.
pub async fn concurrent_appends_one_wins(store: Arc<dyn EventStore>) {
    const ROUNDS: u64 = 8;
    let id = create_new(&*store, new_invocation(1_000, None, "d"))
        .await
        .invocation_id;
    for version in 0..ROUNDS {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let store = Arc::clone(&store);
            tasks.spawn(async move {
                let events = [lookup_turn(version + 1, 1)];
                store.append(id, append_of(version, 1, &events)).await
            });
        }
        let mut ok = 0;
        while let Some(joined) = tasks.join_next().await {
            match joined.expect("task") {
                Ok(()) => ok += 1,
                Err(StoreError::VersionConflict { actual, .. }) if actual == version + 1 => {}
                Err(other) => panic!("expected success or VersionConflict, got {other}"),
            }
        }
        assert_eq!(ok, 1, "exactly one writer extends version {version}");
    }
    assert_eq!(event_count(&*store, id).await as u64, ROUNDS);
}

/// An older lease epoch is refused; the same or a newer one commits and becomes current.
pub async fn lease_epoch_fencing(store: Arc<dyn EventStore>) {
    let id = create_new(&*store, new_invocation(1_000, None, "d"))
        .await
        .invocation_id;
    store
        .append(id, append_of(0, 5, &[lookup_turn(1, 1)]))
        .await
        .expect("epoch 5");
    match store
        .append(id, append_of(1, 4, &[lookup_turn(2, 2)]))
        .await
    {
        Err(StoreError::StaleEpoch {
            invocation_id,
            presented,
            current,
        }) => {
            assert_eq!((invocation_id, presented, current), (id, 4, 5));
        }
        other => panic!("expected StaleEpoch, got {other:?}"),
    }
    assert_eq!(store.get(id).await.unwrap().version, 1, "nothing written");
    store
        .append(id, append_of(1, 5, &[lookup_turn(2, 2)]))
        .await
        .expect("same epoch");
    store
        .append(id, append_of(2, 9, &[lookup_turn(3, 3)]))
        .await
        .expect("newer epoch");
    let record = store.get(id).await.unwrap();
    assert_eq!((record.version, record.lease_epoch), (3, 9));
    assert!(matches!(
        store
            .append(id, append_of(3, 5, &[lookup_turn(4, 4)]))
            .await,
        Err(StoreError::StaleEpoch {
            presented: 5,
            current: 9,
            ..
        })
    ));
    assert_eq!(event_count(&*store, id).await, 3);
}

/// After an `Ended` event nothing more is appended, whatever the version and epoch.
pub async fn append_after_ended_refused(store: Arc<dyn EventStore>) {
    let id = create_new(&*store, new_invocation(1_000, None, "d"))
        .await
        .invocation_id;
    let commit = [lookup_turn(1, 1), ended(2, TerminalReason::Completed)];
    store
        .append(id, append_of(0, 1, &commit))
        .await
        .expect("turn and end in one commit");
    let record = store.get(id).await.unwrap();
    assert_eq!(record.state, InvocationState::Ended);
    assert_eq!(
        record.end.map(|end| end.reason),
        Some(TerminalReason::Completed)
    );
    for (expected, epoch) in [(2u64, 1u64), (2, 7), (1, 1)] {
        let events = [lookup_turn(expected + 1, 3)];
        match store.append(id, append_of(expected, epoch, &events)).await {
            Err(StoreError::Ended(ended_id)) => assert_eq!(ended_id, id),
            other => panic!("expected Ended, got {other:?}"),
        }
    }
    assert_eq!(event_count(&*store, id).await, 2);
    assert!(store.running(None, 10).await.unwrap().is_empty());
}

/// Empty appends, seq gaps and an `Ended` that is not last are refused; nothing is written.
pub async fn malformed_appends_write_nothing(store: Arc<dyn EventStore>) {
    let id = create_new(&*store, new_invocation(1_000, None, "d"))
        .await
        .invocation_id;
    let bad: [Vec<Event>; 5] = [
        vec![],
        vec![lookup_turn(2, 1)],
        vec![lookup_turn(0, 1)],
        vec![lookup_turn(1, 1), lookup_turn(3, 2)],
        vec![ended(1, TerminalReason::Cancelled), lookup_turn(2, 1)],
    ];
    for events in &bad {
        match store.append(id, append_of(0, 1, events)).await {
            Err(StoreError::MalformedAppend(_)) => {}
            other => panic!("expected MalformedAppend for {events:?}, got {other:?}"),
        }
    }
    let record = store.get(id).await.unwrap();
    assert_eq!((record.version, record.lease_epoch), (0, 0));
    assert_eq!(record.state, InvocationState::Running);
    assert_eq!(event_count(&*store, id).await, 0);
}

/// Another tenant's invocation, created at `ms`.
fn of_tenant(tenant: &str, ms: u64, key: Option<&str>, digest: &str) -> NewInvocation {
    NewInvocation {
        tenant: tenant.to_owned(),
        ..new_invocation(ms, key, digest)
    }
}

/// One key in two tenants is two invocations, a conflict names only the caller's own
/// invocation, and a tenant's listing holds its invocations alone, paged and filtered.
pub async fn tenants_apart(store: Arc<dyn EventStore>) {
    let ours = create_new(&*store, of_tenant("a", 1_000, Some("k"), "d1")).await;
    let theirs = create_new(&*store, of_tenant("b", 2_000, Some("k"), "d2")).await;
    assert_ne!(ours.invocation_id, theirs.invocation_id);
    assert_eq!(theirs.idempotency_key.as_deref(), Some("k"));
    assert_eq!(store.get(theirs.invocation_id).await.unwrap().tenant, "b");
    // Tenant names that would collide if keys were only joined with a separator.
    create_new(&*store, of_tenant("a:k", 2_500, Some("x"), "d")).await;
    create_new(&*store, of_tenant("a", 2_600, Some("k:x"), "d")).await;
    match store.create(of_tenant("b", 3_000, Some("k"), "d1")).await {
        Err(StoreError::IdempotencyConflict { key, existing }) => {
            assert_eq!((key.as_str(), existing), ("k", theirs.invocation_id));
        }
        other => panic!("expected b's own conflict, got {other:?}"),
    }
    match store.create(of_tenant("a", 4_000, Some("k"), "d1")).await {
        Ok(Created::Existing(record)) => assert_eq!(record.invocation_id, ours.invocation_id),
        other => panic!("expected a's invocation, got {other:?}"),
    }
    let mut a_ids = vec![ours.invocation_id];
    for ms in 5_000..5_004 {
        a_ids.push(
            create_new(&*store, of_tenant("a", ms, None, "d"))
                .await
                .invocation_id,
        );
    }
    store
        .append(
            a_ids[2],
            append_of(0, 1, &[ended(1, TerminalReason::MaxSteps)]),
        )
        .await
        .unwrap();
    let list = |tenant: &str, limit, before, state| {
        let store = Arc::clone(&store);
        let tenant = Some(tenant.to_owned());
        async move {
            store
                .list(ListRequest {
                    limit,
                    before,
                    state,
                    tenant,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_iter()
                .map(|record| (record.tenant, record.invocation_id))
                .collect::<Vec<_>>()
        }
    };
    let b = list("b", 100, None, None).await;
    assert_eq!(b, [("b".to_owned(), theirs.invocation_id)]);
    let first = list("a", 2, None, None).await;
    let rest = list("a", 100, Some(first[1].1), None).await;
    let mut seen: Vec<Uuid> = first.iter().chain(&rest).map(|(_, id)| *id).collect();
    assert!(first.iter().chain(&rest).all(|(tenant, _)| tenant == "a"));
    // Four without a key, `ours` and the "k:x" one.
    assert_eq!(seen.len(), 6);
    seen.retain(|id| a_ids.contains(id));
    assert_eq!(seen, a_ids.iter().rev().copied().collect::<Vec<_>>());
    let ended = list("a", 100, None, Some(InvocationState::Ended)).await;
    assert_eq!(ended, [("a".to_owned(), a_ids[2])]);
    assert!(list("c", 100, None, None).await.is_empty());
}

/// Listings come newest first, page with `before`, and filter by state.
pub async fn list_paging(store: Arc<dyn EventStore>) {
    let ids = new_invocations(&*store, 7).await;
    // End the 2nd, 4th and 6th.
    for index in [1usize, 3, 5] {
        store
            .append(
                ids[index],
                append_of(0, 1, &[ended(1, TerminalReason::MaxSteps)]),
            )
            .await
            .expect("end");
    }
    let page = |limit, before, state| {
        let store = Arc::clone(&store);
        async move {
            store
                .list(ListRequest {
                    limit,
                    before,
                    state,
                    ..Default::default()
                })
                .await
                .expect("list")
                .into_iter()
                .map(|record| record.invocation_id)
                .collect::<Vec<Uuid>>()
        }
    };
    let newest_first: Vec<Uuid> = ids.iter().rev().copied().collect();
    assert_eq!(page(3, None, None).await, newest_first[..3]);
    assert_eq!(
        page(3, Some(newest_first[2]), None).await,
        newest_first[3..6]
    );
    assert_eq!(
        page(3, Some(newest_first[5]), None).await,
        newest_first[6..]
    );
    assert!(page(3, Some(ids[0]), None).await.is_empty());
    assert_eq!(page(100, None, None).await, newest_first);

    let ended = page(100, None, Some(InvocationState::Ended)).await;
    assert_eq!(ended, [ids[5], ids[3], ids[1]]);
    let running = page(2, None, Some(InvocationState::Running)).await;
    assert_eq!(running, [ids[6], ids[4]]);
    let running = page(2, Some(ids[4]), Some(InvocationState::Running)).await;
    assert_eq!(running, [ids[2], ids[0]]);

    let records = store
        .list(ListRequest {
            limit: 1,
            state: Some(InvocationState::Ended),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0],
        store.get(ids[5]).await.unwrap(),
        "listed records are whole"
    );
}

/// Listings filter by the end's reason and by the creation time, alone, together and
/// with the state, and page with `before` under a filter.
pub async fn list_filters(store: Arc<dyn EventStore>) {
    // Created at 1000, 1001, ... 1005 ms.
    let ids = new_invocations(&*store, 6).await;
    for (index, reason) in [
        (1, TerminalReason::MaxSteps),
        (2, TerminalReason::Cancelled),
    ] {
        store
            .append(ids[index], append_of(0, 1, &[ended(1, reason)]))
            .await
            .expect("end");
    }
    let page = |request: ListRequest| {
        let store = Arc::clone(&store);
        async move {
            store
                .list(ListRequest {
                    limit: 100,
                    ..request
                })
                .await
                .expect("list")
                .into_iter()
                .map(|record| record.invocation_id)
                .collect::<Vec<Uuid>>()
        }
    };
    let reason = |reason| ListRequest {
        reason: Some(reason),
        ..ListRequest::default()
    };
    assert_eq!(page(reason(TerminalReason::MaxSteps)).await, [ids[1]]);
    assert!(page(reason(TerminalReason::Completed)).await.is_empty());
    let cancelled_and_ended = ListRequest {
        state: Some(InvocationState::Ended),
        ..reason(TerminalReason::Cancelled)
    };
    assert_eq!(page(cancelled_and_ended).await, [ids[2]]);
    let created = |from: Option<u64>, before: Option<u64>| ListRequest {
        created_from: from.map(UnixMillis),
        created_before: before.map(UnixMillis),
        ..ListRequest::default()
    };
    assert_eq!(
        page(created(Some(1003), None)).await,
        [ids[5], ids[4], ids[3]]
    );
    assert_eq!(page(created(None, Some(1002))).await, [ids[1], ids[0]]);
    assert_eq!(
        page(created(Some(1001), Some(1004))).await,
        [ids[3], ids[2], ids[1]]
    );
    let late_max_steps = ListRequest {
        reason: Some(TerminalReason::MaxSteps),
        ..created(Some(1002), None)
    };
    assert!(page(late_max_steps).await.is_empty());
    // A page under a filter, then the next one from its last ID.
    let first = store
        .list(ListRequest {
            limit: 2,
            ..created(Some(1001), None)
        })
        .await
        .expect("list");
    let first: Vec<Uuid> = first.iter().map(|record| record.invocation_id).collect();
    assert_eq!(first, [ids[5], ids[4]]);
    let rest = ListRequest {
        before: Some(ids[4]),
        ..created(Some(1001), None)
    };
    assert_eq!(page(rest).await, [ids[3], ids[2], ids[1]]);
}

/// `running()` returns the not-ended invocations, oldest first, up to the limit, and
/// pages after a given ID.
pub async fn running_oldest_first(store: Arc<dyn EventStore>) {
    let ids = new_invocations(&*store, 4).await;
    store
        .append(ids[1], append_of(0, 1, &[lookup_turn(1, 1)]))
        .await
        .unwrap();
    store
        .append(
            ids[2],
            append_of(0, 1, &[ended(1, TerminalReason::Cancelled)]),
        )
        .await
        .unwrap();
    assert_eq!(
        store.running(None, 10).await.unwrap(),
        [ids[0], ids[1], ids[3]]
    );
    assert_eq!(store.running(None, 2).await.unwrap(), [ids[0], ids[1]]);
    assert_eq!(store.running(Some(ids[1]), 2).await.unwrap(), [ids[3]]);
    assert_eq!(
        store.running(Some(ids[0]), 10).await.unwrap(),
        [ids[1], ids[3]]
    );
    assert!(store.running(Some(ids[3]), 10).await.unwrap().is_empty());
    assert!(store.running(None, 0).await.unwrap().is_empty());
}

/// A claim raises the stored epoch, so the previous holder's commits are refused before
/// the new holder commits anything; an older claim is refused; an ended invocation is
/// returned as it is.
pub async fn claim_fences_older_epochs(store: Arc<dyn EventStore>) {
    let id = create_new(&*store, new_invocation(1_000, None, "d"))
        .await
        .invocation_id;
    store
        .append(id, append_of(0, 5, &[lookup_turn(1, 1)]))
        .await
        .expect("epoch 5 commits");
    let claimed = store.claim(id, 8).await.expect("newer epoch claims");
    assert_eq!((claimed.lease_epoch, claimed.version), (8, 1));
    assert_eq!(
        store.get(id).await.unwrap().lease_epoch,
        8,
        "the claim is stored"
    );
    // The paused holder of epoch 5 wakes up and tries to commit its next turn.
    assert!(matches!(
        store
            .append(id, append_of(1, 5, &[lookup_turn(2, 2)]))
            .await,
        Err(StoreError::StaleEpoch {
            presented: 5,
            current: 8,
            ..
        })
    ));
    assert_eq!(event_count(&*store, id).await, 1, "nothing written");
    assert!(matches!(
        store.claim(id, 7).await,
        Err(StoreError::StaleEpoch {
            presented: 7,
            current: 8,
            ..
        })
    ));
    assert_eq!(
        store.claim(id, 8).await.unwrap().lease_epoch,
        8,
        "same epoch again"
    );
    store
        .append(id, append_of(1, 8, &[ended(2, TerminalReason::Cancelled)]))
        .await
        .expect("the new holder commits");
    let ended_record = store.claim(id, 20).await.expect("claiming an ended one");
    assert_eq!(ended_record.state, InvocationState::Ended);
    assert_eq!(
        ended_record.lease_epoch, 8,
        "an ended invocation is not changed"
    );
    assert!(matches!(
        store.claim(id_at(9_999), 1).await,
        Err(StoreError::NotFound(_))
    ));
}

/// Claims racing with different epochs: whatever the order, the newest epoch ends up
/// stored and only commits carrying it go through.
pub async fn concurrent_claims_newest_wins(store: Arc<dyn EventStore>) {
    let id = create_new(&*store, new_invocation(1_000, None, "d"))
        .await
        .invocation_id;
    let claims = (1..=16u64).map(|epoch| {
        let store = store.clone();
        tokio::spawn(async move { store.claim(id, epoch * 10).await.map(|r| r.lease_epoch) })
    });
    let mut granted = 0;
    for claim in claims {
        match claim.await.unwrap() {
            Ok(_) => granted += 1,
            Err(StoreError::StaleEpoch { .. }) => {}
            Err(other) => panic!("unexpected claim error: {other}"),
        }
    }
    assert!(granted >= 1);
    assert_eq!(store.get(id).await.unwrap().lease_epoch, 160);
    assert!(matches!(
        store
            .append(id, append_of(0, 150, &[lookup_turn(1, 1)]))
            .await,
        Err(StoreError::StaleEpoch { .. })
    ));
    store
        .append(id, append_of(0, 160, &[lookup_turn(1, 1)]))
        .await
        .expect("the newest epoch commits");
}

/// A cancel request is stored with its first time, survives later commits, and leaves an
/// ended invocation alone.
pub async fn cancel_requests_are_durable(store: Arc<dyn EventStore>) {
    let id = create_new(&*store, new_invocation(1_000, None, "d"))
        .await
        .invocation_id;
    assert_eq!(store.get(id).await.unwrap().cancel_requested_at, None);
    let record = store
        .request_cancel(id, UnixMillis(2_000), "wrong customer")
        .await
        .unwrap();
    assert_eq!(record.cancel_requested_at, Some(UnixMillis(2_000)));
    assert_eq!(record.cancel_reason, "wrong customer");
    let again = store
        .request_cancel(id, UnixMillis(3_000), "another reason")
        .await
        .unwrap();
    assert_eq!(
        again.cancel_requested_at,
        Some(UnixMillis(2_000)),
        "first time kept"
    );
    assert_eq!(again.cancel_reason, "wrong customer", "first reason kept");
    assert_eq!(store.get(id).await.unwrap().cancel_reason, "wrong customer");
    store
        .append(id, append_of(0, 1, &[lookup_turn(1, 1)]))
        .await
        .unwrap();
    let stored = store.get(id).await.unwrap();
    assert_eq!(stored.cancel_requested_at, Some(UnixMillis(2_000)));
    assert_eq!(stored.version, 1, "a cancel request does not block commits");
    let listed = store
        .list(ListRequest {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed[0].cancel_requested_at, Some(UnixMillis(2_000)));

    let other = create_new(&*store, new_invocation(1_001, None, "d"))
        .await
        .invocation_id;
    store
        .append(
            other,
            append_of(0, 1, &[ended(1, TerminalReason::Completed)]),
        )
        .await
        .unwrap();
    let ended_record = store
        .request_cancel(other, UnixMillis(2_000), "")
        .await
        .unwrap();
    assert_eq!(
        ended_record.cancel_requested_at, None,
        "an ended invocation is left alone"
    );
    assert!(matches!(
        store.request_cancel(id_at(9_999), UnixMillis(1), "").await,
        Err(StoreError::NotFound(_))
    ));
}

/// A run that stops to wait for a human leaves the invocation `Waiting` with its end
/// and wait bound: not running, found by `expired_waits` once the bound passes, open to
/// one reply (which makes it running again, its end cleared) or to a final end.
pub async fn waits_for_humans(store: Arc<dyn EventStore>) {
    let waiting_end = |seq: u64, until: u64| Event {
        seq,
        body: EventBody::Ended(EndRecord {
            reason: TerminalReason::ClarificationRequired,
            detail: "which account?".to_owned(),
            answer: None,
            proposal: None,
            wait: Some(Wait {
                since: UnixMillis(1_000),
                until: UnixMillis(until),
            }),
            accepted_by: Vec::new(),
            input: None,
        }),
    };
    let answer = |seq: u64| Event {
        seq,
        body: EventBody::ClarificationAnswered(Answer {
            answer: "acct-1".to_owned(),
            actor: "ana".to_owned(),
            waited_ms: 10,
            action: None,
        }),
    };
    let asks = |seq: u64| {
        turn(
            seq,
            ProposedDecision::Clarification {
                question: "which account?".to_owned(),
            },
        )
    };
    let id = create_new(&*store, new_invocation(1_000, None, "d"))
        .await
        .invocation_id;
    let soon = create_new(&*store, new_invocation(1_001, None, "d"))
        .await
        .invocation_id;
    store
        .append(id, append_of(0, 1, &[asks(1), waiting_end(2, 60_000)]))
        .await
        .unwrap();
    store
        .append(soon, append_of(0, 1, &[asks(1), waiting_end(2, 5_000)]))
        .await
        .unwrap();
    let record = store.get(id).await.unwrap();
    assert_eq!(record.state, InvocationState::Waiting);
    assert!(record.end.as_ref().is_some_and(EndRecord::waits));
    assert!(store.running(None, 10).await.unwrap().is_empty());
    let waiting = store
        .list(ListRequest {
            limit: 10,
            state: Some(InvocationState::Waiting),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(waiting.len(), 2);
    assert_eq!(
        store.count_waiting().await.unwrap(),
        vec![(TerminalReason::ClarificationRequired, 2)]
    );

    assert!(
        store
            .expired_waits(UnixMillis(4_999), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.expired_waits(UnixMillis(5_000), 10).await.unwrap(),
        vec![soon]
    );
    assert_eq!(
        store.expired_waits(UnixMillis(90_000), 10).await.unwrap(),
        vec![soon, id],
        "soonest bound first"
    );

    // Two replies to one wait: the version decides, exactly one is committed.
    let reply = [answer(3)];
    let (first, second) = tokio::join!(
        store.append(id, append_of(2, 1, &reply)),
        store.append(id, append_of(2, 1, &reply)),
    );
    assert!(
        first.is_ok() != second.is_ok(),
        "one wins: {first:?} {second:?}"
    );
    let record = store.get(id).await.unwrap();
    assert_eq!(record.state, InvocationState::Running);
    assert_eq!(record.end, None, "a resumed invocation has no end");
    assert_eq!(store.running(None, 10).await.unwrap(), vec![id]);
    assert_eq!(
        store.expired_waits(UnixMillis(90_000), 10).await.unwrap(),
        vec![soon],
        "a resumed invocation no longer waits"
    );
    assert_eq!(
        store.count_waiting().await.unwrap(),
        vec![(TerminalReason::ClarificationRequired, 1)]
    );

    // A final end after the wait closes it for good.
    store
        .append(
            soon,
            append_of(2, 1, &[ended(3, TerminalReason::DeadlineExceeded)]),
        )
        .await
        .unwrap();
    let record = store.get(soon).await.unwrap();
    assert_eq!(record.state, InvocationState::Ended);
    assert_eq!(
        record.end.map(|end| end.reason),
        Some(TerminalReason::DeadlineExceeded)
    );
    assert!(
        store
            .expired_waits(UnixMillis(90_000), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.count_waiting().await.unwrap().is_empty());
    assert!(matches!(
        store.append(soon, append_of(3, 1, &[answer(4)])).await,
        Err(StoreError::Ended(_))
    ));
}

/// Every operation on an unknown invocation says `NotFound` with its ID.
pub async fn not_found(store: Arc<dyn EventStore>) {
    create_new(&*store, new_invocation(1_000, None, "d")).await;
    let unknown = id_at(9_999);
    assert!(matches!(store.get(unknown).await, Err(StoreError::NotFound(id)) if id == unknown));
    assert!(matches!(
        store.events(unknown, 0, 10).await,
        Err(StoreError::NotFound(id)) if id == unknown
    ));
    assert!(matches!(
        store.append(unknown, append_of(0, 1, &[lookup_turn(1, 1)])).await,
        Err(StoreError::NotFound(id)) if id == unknown
    ));
    assert!(matches!(
        store.get(unknown).await,
        Err(StoreError::NotFound(_))
    ));
}
