//! Creating invocations and reading them back: round trip, idempotency keys, unknown IDs.

use std::sync::Arc;

use agentloop_engine::Totals;

use crate::{Created, EventStore, InvocationState, ListRequest, StoreError};

use super::fixtures::{append_of, create_new, id_at, lookup_turn, new_invocation};

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
            before: None,
            state: None,
            tenant: None,
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
            before: None,
            state: None,
            tenant: None,
        })
        .await
        .expect("list");
    assert_eq!(all.len() as u64, ROUNDS, "one invocation per key");
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
