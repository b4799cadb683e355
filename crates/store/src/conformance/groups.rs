//! Checks of a group commit, which each backend drives its own way: it holds its writer,
//! lets the writes queue behind it ([`until_queued`]), and releases it.

use agentloop_engine::EventBody;
use futures::future::BoxFuture;
use uuid::Uuid;

use super::{append_of, create_new, every_kind_of_event, lookup_turn, new_invocation};
use crate::{EventStore, StoreError};

/// Polls `writes` until `queued()` says `count` of them wait behind a held writer: each
/// poll lets every write that can enqueue do so, and none may finish while it is held.
pub async fn until_queued<F: std::future::Future>(
    mut writes: std::pin::Pin<&mut F>,
    count: usize,
    queued: impl Fn() -> usize,
) {
    while queued() < count {
        assert!(
            futures::poll!(writes.as_mut()).is_pending(),
            "a write finished while the writer was held"
        );
        tokio::task::yield_now().await;
    }
}

/// `count` new invocations, running at version 0.
pub async fn new_invocations(store: &dyn EventStore, count: u64) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for index in 0..count {
        let new = new_invocation(1_000 + index, None, "d");
        ids.push(create_new(store, new).await.invocation_id);
    }
    ids
}

/// An append that passes every check but breaks its group's SQL (an event row that
/// `behind_the_back` writes without the store) fails alone, and the other appends of its
/// group commit. Returns how many groups carried them.
pub async fn a_broken_append_fails_alone(
    store: &dyn EventStore,
    behind_the_back: impl AsyncFnOnce(Uuid),
    in_one_group: impl for<'a> AsyncFnOnce(
        usize,
        BoxFuture<'a, Vec<Result<(), StoreError>>>,
    ) -> (Vec<Result<(), StoreError>>, u64),
) -> u64 {
    let ids = new_invocations(store, 4).await;
    let culprit = ids[0];
    behind_the_back(culprit).await;
    let events = [lookup_turn(1, 1)];
    let appends = futures::future::join_all(
        ids.iter()
            .map(|id| store.append(*id, append_of(0, 1, &events))),
    );
    let (verdicts, groups) = in_one_group(ids.len(), Box::pin(appends)).await;
    assert!(
        matches!(&verdicts[0], Err(StoreError::Database(_))),
        "{verdicts:?}"
    );
    assert!(verdicts[1..].iter().all(Result::is_ok), "{verdicts:?}");
    assert_eq!(store.get(culprit).await.unwrap().version, 0);
    for id in &ids[1..] {
        assert_eq!(store.get(*id).await.unwrap().version, 1);
    }
    groups
}

/// The verdicts of a group commit: appends to six invocations, one of every verdict (a
/// good one, a version conflict, a lease lost to a newer epoch, an ended invocation, an
/// unknown one, two appends to one invocation, the same version twice), put in one group
/// by `in_one_group` (given how many appends to wait for) and answered each as if alone.
/// Returns how many groups carried them, which each backend's test checks.
pub async fn every_verdict_in_one_group(
    store: &dyn EventStore,
    in_one_group: impl for<'a> AsyncFnOnce(
        usize,
        BoxFuture<'a, Vec<Result<(), StoreError>>>,
    ) -> (Vec<Result<(), StoreError>>, u64),
) -> u64 {
    let ids = new_invocations(store, 6).await;
    let [good, conflict, fenced, ended, twice, other] = ids[..] else {
        unreachable!("six invocations")
    };
    // Set-up: `fenced` was taken over by epoch 5, `ended` has ended.
    store
        .append(fenced, append_of(0, 5, &[lookup_turn(1, 1)]))
        .await
        .unwrap();
    let mut end = every_kind_of_event()
        .into_iter()
        .rfind(|e| matches!(e.body, EventBody::Ended(ref end) if !end.waits()))
        .unwrap();
    end.seq = 1;
    store
        .append(ended, append_of(0, 1, std::slice::from_ref(&end)))
        .await
        .unwrap();

    let (turn1, turn2, turn4) = (
        [lookup_turn(1, 1)],
        [lookup_turn(2, 2)],
        [lookup_turn(4, 4)],
    );
    let missing = Uuid::now_v7();
    let appends = futures::future::join_all([
        store.append(good, append_of(0, 1, &turn1)),
        store.append(conflict, append_of(3, 1, &turn4)),
        store.append(fenced, append_of(1, 4, &turn2)),
        store.append(ended, append_of(1, 1, &turn2)),
        store.append(missing, append_of(0, 1, &turn1)),
        // Two appends to one invocation: the second extends the first.
        store.append(twice, append_of(0, 1, &turn1)),
        store.append(twice, append_of(1, 1, &turn2)),
        // The same version twice: the first wins, the second sees it.
        store.append(other, append_of(0, 1, &turn1)),
        store.append(other, append_of(0, 1, &turn1)),
    ]);
    let (verdicts, groups) = in_one_group(9, Box::pin(appends)).await;

    let mut verdicts = verdicts.into_iter();
    let mut next = || verdicts.next().unwrap();
    assert!(next().is_ok());
    assert!(matches!(
        next(),
        Err(StoreError::VersionConflict {
            expected: 3,
            actual: 0,
            ..
        })
    ));
    assert!(matches!(
        next(),
        Err(StoreError::StaleEpoch {
            presented: 4,
            current: 5,
            ..
        })
    ));
    assert!(matches!(next(), Err(StoreError::Ended(id)) if id == ended));
    assert!(matches!(next(), Err(StoreError::NotFound(id)) if id == missing));
    assert!(next().is_ok());
    assert!(next().is_ok());
    assert!(next().is_ok());
    assert!(matches!(
        next(),
        Err(StoreError::VersionConflict {
            expected: 0,
            actual: 1,
            ..
        })
    ));

    // Nothing of a refused append was written.
    let fenced_record = store.get(fenced).await.unwrap();
    assert_eq!((fenced_record.version, fenced_record.lease_epoch), (1, 5));
    assert_eq!(store.events(fenced, 1, 10).await.unwrap().len(), 1);
    assert_eq!(store.get(conflict).await.unwrap().version, 0);
    assert!(store.events(conflict, 1, 10).await.unwrap().is_empty());
    assert_eq!(store.get(ended).await.unwrap().version, 1);
    assert_eq!(store.get(good).await.unwrap().version, 1);
    assert_eq!(store.get(twice).await.unwrap().version, 2);
    assert_eq!(store.events(twice, 1, 10).await.unwrap().len(), 2);
    assert_eq!(store.get(other).await.unwrap().version, 1);
    assert_eq!(store.events(other, 1, 10).await.unwrap().len(), 1);
    groups
}
