//! Listings: tenants kept apart, newest-first paging, and the running invocations.

use std::sync::Arc;

use agentloop_engine::TerminalReason;
use uuid::Uuid;

use crate::{Created, EventStore, InvocationState, ListRequest, NewInvocation, StoreError};

use super::fixtures::{append_of, create_new, ended, lookup_turn, new_invocation};

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
    let mut ids = Vec::new();
    for index in 0..7u64 {
        let record = create_new(&*store, new_invocation(1_000 + index, None, "d")).await;
        ids.push(record.invocation_id);
    }
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
                    tenant: None,
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
            before: None,
            state: Some(InvocationState::Ended),
            tenant: None,
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

/// `running()` returns the not-ended invocations, oldest first, up to the limit, and
/// pages after a given ID.
pub async fn running_oldest_first(store: Arc<dyn EventStore>) {
    let mut ids = Vec::new();
    for index in 0..4u64 {
        let record = create_new(&*store, new_invocation(1_000 + index, None, "d")).await;
        ids.push(record.invocation_id);
    }
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
