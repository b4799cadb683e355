//! Appending and reading the log: every kind of event, paging, malformed appends.

use std::sync::Arc;

use agentloop_engine::{Event, EventBody, TerminalReason, UnixMillis};

use crate::{Append, EventStore, InvocationState, StoreError};

use super::fixtures::{
    append_of, create_new, ended, event_count, every_kind_of_event, lookup_turn, new_invocation,
    totals,
};

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
