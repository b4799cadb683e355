//! Group commit of the SQLite store: concurrent writes share one transaction and one
//! fsync, and each still gets its own result.
//!
//! The writer runs on a thread of its own and takes a write as soon as it is queued. To
//! put writes in one group deterministically, a test holds the writer inside a group
//! (`SqliteStore::hold_writer`), issues its writes until all of them are queued behind it,
//! then releases it: the writer takes the queued writes together, as under load.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use agentloop_store::conformance::{
    a_broken_append_fails_alone, append_of, every_verdict_in_one_group, lookup_turn,
    new_invocation, new_invocations, until_queued,
};
use agentloop_store::{Created, EventStore, SqliteStore, StoreError};
use futures::future::join_all;
use uuid::Uuid;

/// Writes event 1 of `id` behind the store's back, so that the store's own insert of it
/// fails in SQL although every check passes.
async fn event_behind_the_stores_back(dir: &std::path::Path, id: Uuid) {
    use sqlx::ConnectOptions;
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.join("events.db"))
        .connect()
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO events (invocation_id, seq, committed_at, body) VALUES (?, 1, 0, '{}')",
    )
    .bind(id.hyphenated().to_string())
    .execute(&mut conn)
    .await
    .unwrap();
}

/// Runs `writes` as one group: holds the writer, polls `writes` until `count` of them
/// are queued, releases the writer, then finishes them. Returns their results and the
/// commits they took (the held group's own commit excluded).
async fn in_one_group<F: std::future::Future>(
    store: &SqliteStore,
    count: usize,
    writes: F,
) -> (F::Output, u64) {
    let before = store.stats();
    let hold = store.hold_writer().await.unwrap();
    let mut writes = std::pin::pin!(writes);
    until_queued(writes.as_mut(), count, || hold.queued()).await;
    hold.release().await.unwrap();
    let results = writes.await;
    // The held group commits too (a session that succeeded).
    (results, store.stats().commits - before.commits - 1)
}

async fn fresh() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_in(dir.path()).await.expect("open");
    (store, dir)
}

#[tokio::test]
async fn concurrent_appends_share_one_transaction_and_one_fsync() {
    let (store, _dir) = fresh().await;
    let ids = new_invocations(&store, 20).await;
    let events = [lookup_turn(1, 1)];
    let before = store.stats();
    let appends = join_all(
        ids.iter()
            .map(|id| store.append(*id, append_of(0, 1, &events))),
    );
    let (results, commits) = in_one_group(&store, 20, appends).await;
    let after = store.stats();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(commits, 1, "twenty appends, one fsync");
    assert_eq!(after.appends - before.appends, 20);
    assert!(after.largest_group >= 20);
    for id in &ids {
        assert_eq!(store.get(*id).await.unwrap().version, 1);
        assert_eq!(store.events(*id, 1, 10).await.unwrap().len(), 1);
    }
}

#[tokio::test]
async fn concurrent_creates_share_one_fsync_too() {
    let (store, _dir) = fresh().await;
    let creates = join_all((0..20).map(|i| store.create(new_invocation(1_000 + i, None, "d"))));
    let before = store.stats();
    let (created, commits) = in_one_group(&store, 20, creates).await;
    assert!(created.iter().all(|c| matches!(c, Ok(Created::New(_)))));
    let after = store.stats();
    assert_eq!(commits, 1);
    assert_eq!(after.creates - before.creates, 20);
}

#[tokio::test]
async fn a_refused_append_does_not_fail_the_rest_of_its_group() {
    let (store, _dir) = fresh().await;
    let groups = every_verdict_in_one_group(&store, async |count, appends| {
        in_one_group(&store, count, appends).await
    })
    .await;
    assert_eq!(
        groups, 1,
        "one group, the second appends to an invocation in it too"
    );
}

/// An append that passes every check but fails in SQL (here: an event row written behind
/// the store's back) fails alone; the group's other appends still commit.
#[tokio::test]
async fn a_failing_statement_fails_only_its_own_append() {
    let (store, dir) = fresh().await;
    let behind_the_back = async |id| event_behind_the_stores_back(dir.path(), id).await;
    let groups = a_broken_append_fails_alone(&store, behind_the_back, async |count, appends| {
        in_one_group(&store, count, appends).await
    })
    .await;
    assert_eq!(groups, 1);
}

#[tokio::test]
async fn close_commits_what_is_queued_and_refuses_later_writes() {
    let (store, _dir) = fresh().await;
    let ids = new_invocations(&store, 3).await;
    let events = [lookup_turn(1, 1)];
    let (appended, ()) = tokio::join!(
        join_all(
            ids.iter()
                .map(|id| store.append(*id, append_of(0, 1, &events)))
        ),
        store.close()
    );
    assert!(appended.iter().all(Result::is_ok), "{appended:?}");
    let late = store
        .append(ids[0], append_of(1, 1, &[lookup_turn(2, 2)]))
        .await;
    assert!(matches!(late, Err(StoreError::Database(_))), "{late:?}");

    let reopened = SqliteStore::open_in(_dir.path()).await.unwrap();
    for id in &ids {
        assert_eq!(reopened.get(*id).await.unwrap().version, 1);
    }
}

/// Under a steady stream of groups the log is checkpointed and restarted from its start,
/// so it stays a few MiB: a checkpoint beside a busy writer never catches up on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_stays_bounded_under_steady_writes() {
    const INVOCATIONS: u64 = 64;
    const TURNS: u64 = 128;
    let (store, dir) = fresh().await;
    let ids = new_invocations(&store, INVOCATIONS).await;
    let mut writers = tokio::task::JoinSet::new();
    for id in ids {
        let store = store.clone();
        writers.spawn(async move {
            for turn in 1..=TURNS {
                let events = [lookup_turn(turn, u32::try_from(turn).unwrap())];
                store
                    .append(id, append_of(turn - 1, 1, &events))
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.unwrap();
    }
    let stats = store.stats();
    assert_eq!(stats.appends, INVOCATIONS * TURNS);
    assert!(stats.checkpoints >= 2, "{stats:?}");
    let log = std::fs::metadata(dir.path().join("events.db-wal"))
        .unwrap()
        .len();
    // Never restarted, this log would hold every page written: over 60 MiB.
    assert!(log < 24 * 1024 * 1024, "the log grew to {log} bytes");
}

/// Creates of one group are answered in order, as if alone: a key stored already, or
/// taken by an earlier create of the group, answers with that invocation (or a conflict
/// when the request differs); a create whose row cannot be written fails alone.
#[tokio::test]
async fn creates_in_one_group_are_answered_each_as_if_alone() {
    let (store, _dir) = fresh().await;
    let stored = match store
        .create(new_invocation(1_000, Some("stored"), "d1"))
        .await
        .unwrap()
    {
        Created::New(record) => record,
        Created::Existing(_) => panic!("a fresh store"),
    };
    let plain = new_invocation(2_000, None, "d");
    let first = new_invocation(3_000, Some("shared"), "d3");
    let mut again = new_invocation(4_000, Some("shared"), "d3");
    again.spec = first.spec.clone();
    let conflict = new_invocation(5_000, Some("shared"), "other digest");
    let repeat = new_invocation(6_000, Some("stored"), "d1");
    // The same invocation ID as the stored one: its row cannot be written.
    let mut clash = new_invocation(7_000, None, "d");
    clash.invocation_id = stored.invocation_id;
    let creates = join_all([
        store.create(plain.clone()),
        store.create(first.clone()),
        store.create(again),
        store.create(conflict),
        store.create(repeat),
        store.create(clash),
    ]);
    let (results, commits) = in_one_group(&store, 6, creates).await;
    assert_eq!(commits, 1, "{results:?}");
    let mut results = results.into_iter();
    let mut next = || results.next().unwrap();
    assert!(matches!(next(), Ok(Created::New(r)) if r.invocation_id == plain.invocation_id));
    assert!(matches!(next(), Ok(Created::New(r)) if r.invocation_id == first.invocation_id));
    assert!(matches!(next(), Ok(Created::Existing(r)) if r.invocation_id == first.invocation_id));
    assert!(matches!(
        next(),
        Err(StoreError::IdempotencyConflict { existing, .. }) if existing == first.invocation_id
    ));
    assert!(matches!(next(), Ok(Created::Existing(r)) if r.invocation_id == stored.invocation_id));
    assert!(matches!(next(), Err(StoreError::Database(_))));
    for id in [plain.invocation_id, first.invocation_id] {
        assert_eq!(store.get(id).await.unwrap().version, 0);
    }
    assert_eq!(
        store.get(stored.invocation_id).await.unwrap().spec,
        stored.spec
    );
}

/// A group whose appends fail in SQL is rolled back and its appends replayed; a create of
/// the same group is still written, and still answered as written.
#[tokio::test]
async fn a_create_survives_the_replay_of_its_groups_appends() {
    let (store, dir) = fresh().await;
    let ids = new_invocations(&store, 2).await;
    let culprit = ids[0];
    event_behind_the_stores_back(dir.path(), culprit).await;

    let new = new_invocation(9_000, Some("k"), "d");
    let events = [lookup_turn(1, 1)];
    let writes = async {
        tokio::join!(
            store.create(new.clone()),
            store.append(culprit, append_of(0, 1, &events)),
            store.append(ids[1], append_of(0, 1, &events)),
        )
    };
    let ((created, culprit_append, other_append), commits) = in_one_group(&store, 3, writes).await;
    assert_eq!(commits, 1);
    assert!(matches!(created, Ok(Created::New(_))), "{created:?}");
    assert!(matches!(culprit_append, Err(StoreError::Database(_))));
    assert!(other_append.is_ok());
    assert_eq!(store.get(new.invocation_id).await.unwrap().spec, new.spec);
}
