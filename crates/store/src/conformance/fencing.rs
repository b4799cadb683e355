//! What an append may extend: its version, its lease epoch, and never an end.

use std::sync::Arc;

use agentloop_engine::TerminalReason;

use crate::{EventStore, InvocationState, StoreError};

use super::fixtures::{
    append_of, create_new, ended, event_count, lookup_turn, new_invocation, totals,
};

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
