//! Claims and cancel requests: what moves an invocation between workers, or stops it.

use std::sync::Arc;

use agentloop_engine::{TerminalReason, UnixMillis};

use crate::{EventStore, InvocationState, ListRequest, StoreError};

use super::fixtures::{
    append_of, create_new, ended, event_count, id_at, lookup_turn, new_invocation,
};

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
            before: None,
            state: None,
            tenant: None,
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
