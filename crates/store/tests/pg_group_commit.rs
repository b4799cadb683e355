//! Group commit of the PostgreSQL store: the appends of many invocations go to the server
//! as one statement, and each still gets its own verdict; fencing holds inside the group.
//!
//! A test holds the committer (`PgStore::hold_commits`), issues its appends until all of
//! them are queued behind the hold, then releases it: the committer takes the queued
//! appends together, as under load. Skips loudly without a server unless
//! `AGENTLOOP_REQUIRE_POSTGRES=1`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use agentloop_engine::EventBody;
use agentloop_store::conformance::{append_of, every_kind_of_event, lookup_turn, new_invocation};
use agentloop_store::testing::{PostgresServer, TestDatabase};
use agentloop_store::{Created, EventStore, PgOptions, PgStore, StoreError};
use futures::future::join_all;
use sqlx::Connection;
use uuid::Uuid;

async fn fresh(server: &PostgresServer) -> (PgStore, TestDatabase) {
    let database = server.create_database().await.expect("create database");
    let store = PgStore::connect(PgOptions::new(database.url()))
        .await
        .expect("connect to the test database");
    (store, database)
}

async fn invocations(store: &PgStore, count: u64) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for index in 0..count {
        match store
            .create(new_invocation(1_000 + index, None, "d"))
            .await
            .unwrap()
        {
            Created::New(record) => ids.push(record.invocation_id),
            Created::Existing(_) => panic!("no key, so always new"),
        }
    }
    ids
}

/// Sends `appends` while the committer is held, until `count` are queued, then lets it
/// go. Returns their verdicts and how many statements carried them.
async fn held_then_released<F: std::future::Future>(
    store: &PgStore,
    count: usize,
    appends: F,
) -> (F::Output, u64) {
    let before = store.commit_stats();
    let hold = store.hold_commits().await.unwrap();
    let mut appends = std::pin::pin!(appends);
    // Each poll lets every append that can enqueue do so; none can finish while held.
    while hold.queued() < count {
        assert!(
            futures::poll!(appends.as_mut()).is_pending(),
            "an append finished while the committer was held"
        );
        tokio::task::yield_now().await;
    }
    hold.release();
    let verdicts = appends.await;
    (verdicts, store.commit_stats().groups - before.groups)
}

#[tokio::test]
async fn concurrent_appends_share_one_statement() {
    let Some(server) = PostgresServer::for_test("concurrent_appends_share_one_statement").await
    else {
        return;
    };
    let (store, _database) = fresh(&server).await;
    let ids = invocations(&store, 50).await;
    let events = [lookup_turn(1, 1)];
    let appends = join_all(
        ids.iter()
            .map(|id| store.append(*id, append_of(0, 1, &events))),
    );
    let (verdicts, groups) = held_then_released(&store, 50, appends).await;
    assert!(verdicts.iter().all(Result::is_ok), "{verdicts:?}");
    assert_eq!(groups, 1, "fifty appends, one statement");
    assert!(store.commit_stats().largest_group >= 50);
    for id in &ids {
        assert_eq!(store.get(*id).await.unwrap().version, 1);
        assert_eq!(store.events(*id, 1, 10).await.unwrap().len(), 1);
    }
}

/// One invocation of the group lost its lease (a newer epoch committed): it is refused,
/// and so is every other append its row refuses, each for its own reason, while the rest
/// of the group commits.
#[tokio::test]
async fn a_fenced_append_is_refused_and_the_rest_of_its_group_commits() {
    let Some(server) =
        PostgresServer::for_test("a_fenced_append_is_refused_and_the_rest_of_its_group_commits")
            .await
    else {
        return;
    };
    let (store, _database) = fresh(&server).await;
    let ids = invocations(&store, 6).await;
    let [good, conflict, fenced, ended, twice, other] = ids[..] else {
        unreachable!()
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
    let appends = join_all([
        store.append(good, append_of(0, 1, &turn1)),
        store.append(conflict, append_of(3, 1, &turn4)),
        store.append(fenced, append_of(1, 4, &turn2)),
        store.append(ended, append_of(1, 1, &turn2)),
        store.append(missing, append_of(0, 1, &turn1)),
        // A second append to an invocation of the group waits for the next group, and
        // extends the first.
        store.append(twice, append_of(0, 1, &turn1)),
        store.append(twice, append_of(1, 1, &turn2)),
        // The same version twice: the first wins, the second sees it.
        store.append(other, append_of(0, 1, &turn1)),
        store.append(other, append_of(0, 1, &turn1)),
    ]);
    let (verdicts, groups) = held_then_released(&store, 9, appends).await;
    assert_eq!(
        groups, 2,
        "the second appends of two invocations wait: {verdicts:?}"
    );

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
}

/// An append that passes every check but breaks the statement (an event row written
/// behind the store's back) fails alone: its group is written again one by one.
#[tokio::test]
async fn a_statement_the_server_refuses_fails_only_its_culprit() {
    let Some(server) =
        PostgresServer::for_test("a_statement_the_server_refuses_fails_only_its_culprit").await
    else {
        return;
    };
    let (store, database) = fresh(&server).await;
    let ids = invocations(&store, 4).await;
    let culprit = ids[0];
    let mut conn = sqlx::PgConnection::connect(database.url()).await.unwrap();
    sqlx::query(
        "INSERT INTO events (invocation_id, seq, committed_at, body) VALUES ($1::uuid, 1, 0, '{}')",
    )
    .bind(culprit.hyphenated().to_string())
    .execute(&mut conn)
    .await
    .unwrap();

    let events = [lookup_turn(1, 1)];
    let appends = join_all(
        ids.iter()
            .map(|id| store.append(*id, append_of(0, 1, &events))),
    );
    let (verdicts, groups) = held_then_released(&store, 4, appends).await;
    assert_eq!(groups, 1);
    assert!(
        matches!(&verdicts[0], Err(StoreError::Database(_))),
        "{verdicts:?}"
    );
    assert!(verdicts[1..].iter().all(Result::is_ok), "{verdicts:?}");
    assert_eq!(store.get(culprit).await.unwrap().version, 0);
    for id in &ids[1..] {
        assert_eq!(store.get(*id).await.unwrap().version, 1);
    }
}
