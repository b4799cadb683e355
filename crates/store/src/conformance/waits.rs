//! Invocations that wait for a human: their state, wait bound and replies.

use std::sync::Arc;

use agentloop_engine::{
    Answer, EndRecord, Event, EventBody, ProposedDecision, TerminalReason, UnixMillis, Wait,
};

use crate::{EventStore, InvocationState, ListRequest, StoreError};

use super::fixtures::{append_of, create_new, ended, new_invocation, turn};

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
        }),
    };
    let answer = |seq: u64| Event {
        seq,
        body: EventBody::ClarificationAnswered(Answer {
            answer: "acct-1".to_owned(),
            actor: "ana".to_owned(),
            waited_ms: 10,
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
            before: None,
            state: Some(InvocationState::Waiting),
            tenant: None,
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
