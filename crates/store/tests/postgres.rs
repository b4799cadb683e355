//! The PostgreSQL backend: the whole conformance suite (each check on a database of its
//! own), durability across a reconnect, fencing between two racing writers, group commit
//! (appends of many invocations in one statement, each with its own verdict), and what
//! only this backend has to get right (session settings, JSON PostgreSQL is picky about,
//! corrupt rows). Skips loudly without a server unless `AGENTLOOP_REQUIRE_POSTGRES=1`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::sync::Arc;
use std::time::Duration;

use agentloop_engine::{CallId, CallOutcome, CallResult, EventBody};
use agentloop_store::conformance::{
    self, a_broken_append_fails_alone, append_of, every_verdict_in_one_group, lookup_turn,
    new_invocation, new_invocations, until_queued,
};
use agentloop_store::testing::{PostgresServer, TestDatabase, earlier_migrations};
use agentloop_store::{Created, EventStore, PgOptions, PgStore, StoreError};
use futures::future::join_all;
use sqlx::Connection;
use tokio::sync::Barrier;
use uuid::Uuid;

async fn store_on(database: &TestDatabase) -> PgStore {
    PgStore::connect(PgOptions::new(database.url()))
        .await
        .expect("connect to the test database")
}

/// A new invocation in `store`, not yet claimed.
async fn created(store: &PgStore) -> Uuid {
    let new = new_invocation(1_000, None, "d");
    let id = new.invocation_id;
    store.create(new).await.unwrap();
    id
}

async fn fresh(server: &PostgresServer) -> (PgStore, TestDatabase) {
    let database = server.create_database().await.expect("create database");
    (store_on(&database).await, database)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passes_the_conformance_suite() {
    let Some(server) = PostgresServer::for_test("postgres_passes_the_conformance_suite").await
    else {
        return;
    };
    conformance::run_all(|| fresh(&server)).await;
}

#[tokio::test]
async fn test_databases_are_unique_and_dropped() {
    let Some(server) = PostgresServer::for_test("test_databases_are_unique_and_dropped").await
    else {
        return;
    };
    let first = server.create_database().await.unwrap();
    let second = server.create_database().await.unwrap();
    assert_ne!(first.name(), second.name());
    assert!(first.name().starts_with("agentloop_test_"));
    let exists = |name: String| {
        let admin = server.admin_url().to_owned();
        async move {
            let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
            let found: Option<i32> =
                sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
                    .bind(name)
                    .fetch_optional(&mut conn)
                    .await
                    .unwrap();
            found.is_some()
        }
    };
    let (first_name, second_name) = (first.name().to_owned(), second.name().to_owned());
    assert!(exists(first_name.clone()).await);
    // A store still connected does not keep its database alive.
    let store = store_on(&first).await;
    drop(first);
    assert!(!exists(first_name).await, "dropped with the value");
    second.drop_database().await.unwrap();
    assert!(!exists(second_name).await, "dropped explicitly");
    drop(store);
}

#[tokio::test]
async fn committed_events_survive_a_reconnect() {
    let Some(server) = PostgresServer::for_test("committed_events_survive_a_reconnect").await
    else {
        return;
    };
    let database = server.create_database().await.unwrap();
    let store = store_on(&database).await;
    assert_eq!(store.synchronous_commit().await.unwrap(), "on");
    let new = new_invocation(1_000, Some("key"), "digest");
    let id = new.invocation_id;
    assert!(matches!(
        store.create(new.clone()).await.unwrap(),
        Created::New(_)
    ));
    let events = [lookup_turn(1, 1), lookup_turn(2, 2)];
    store.append(id, append_of(0, 4, &events)).await.unwrap();
    let before = store.get(id).await.unwrap();
    store.close().await;
    drop(store);

    // A new pool (new sessions); reconnecting also finds the schema already migrated.
    let reconnected = store_on(&database).await;
    assert_eq!(reconnected.get(id).await.unwrap(), before);
    let read: Vec<_> = reconnected
        .events(id, 1, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|stored| stored.event)
        .collect();
    assert_eq!(read, events);
    assert_eq!((before.version, before.lease_epoch), (2, 4));
    assert_eq!(reconnected.running(None, 10).await.unwrap(), [id]);
    match reconnected.create(new).await.unwrap() {
        Created::Existing(record) => assert_eq!(record, before),
        Created::New(_) => panic!("the key was forgotten"),
    }
}

/// What each writer saw, to check against the log.
#[derive(Debug, Default)]
struct WriterReport {
    committed: Vec<u64>,
    fenced: bool,
}

/// Writes turns as `epoch` until it is fenced or has written `turns`, re-reading the
/// version after each conflict. The turn number records the writer: `epoch * 1000 + n`.
async fn writer(
    store: Arc<PgStore>,
    id: Uuid,
    epoch: u64,
    turns: u32,
    start: Arc<Barrier>,
) -> WriterReport {
    let mut report = WriterReport::default();
    start.wait().await;
    let mut written = 0;
    // Bounded: every iteration either commits, is fenced, or lost a race to a commit, and
    // the two writers commit at most 2 * turns times in all.
    for _ in 0..(4 * turns + 4) {
        if written == turns {
            break;
        }
        let version = store.get(id).await.unwrap().version;
        let turn = u32::try_from(epoch).unwrap() * 1_000 + written;
        let events = [lookup_turn(version + 1, turn)];
        match store.append(id, append_of(version, epoch, &events)).await {
            Ok(()) => {
                report.committed.push(version + 1);
                written += 1;
            }
            Err(StoreError::VersionConflict { .. }) => {}
            Err(StoreError::StaleEpoch {
                presented, current, ..
            }) => {
                assert_eq!(presented, epoch);
                assert!(current > epoch);
                report.fenced = true;
                break;
            }
            Err(other) => panic!("writer {epoch}: unexpected {other}"),
        }
        tokio::task::yield_now().await;
    }
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_epoch_never_commits_after_a_newer_one() {
    let Some(server) =
        PostgresServer::for_test("an_older_epoch_never_commits_after_a_newer_one").await
    else {
        return;
    };
    let (store, _database) = fresh(&server).await;
    let store = Arc::new(store);
    const ROUNDS: u64 = 12;
    const TURNS: u32 = 6;
    let mut fenced_rounds = 0;
    for round in 0..ROUNDS {
        let id = store
            .create(new_invocation(1_000 + round, None, "d"))
            .await
            .unwrap();
        let Created::New(record) = id else {
            panic!("a new invocation")
        };
        let id = record.invocation_id;
        let start = Arc::new(Barrier::new(2));
        let old = tokio::spawn(writer(Arc::clone(&store), id, 1, TURNS, Arc::clone(&start)));
        let new = tokio::spawn(writer(Arc::clone(&store), id, 2, TURNS, start));
        let (old, new) = (old.await.unwrap(), new.await.unwrap());

        let log = store.events(id, 1, 1_000).await.unwrap();
        let writers: Vec<u32> = log
            .iter()
            .map(|stored| match &stored.event.body {
                EventBody::Turn(turn) => turn.turn / 1_000,
                other => panic!("only turns were written, not {other:?}"),
            })
            .collect();
        // The log is exactly what the two writers were told they committed.
        assert_eq!(
            log.len(),
            old.committed.len() + new.committed.len(),
            "round {round}: {writers:?}"
        );
        assert_eq!(
            new.committed.len(),
            TURNS as usize,
            "the newer writer is never fenced"
        );
        // The fence: once epoch 2 has committed, epoch 1 never does again.
        if let Some(first_new) = writers.iter().position(|writer| *writer == 2) {
            assert!(
                writers[first_new..].iter().all(|writer| *writer == 2),
                "round {round}: epoch 1 committed after epoch 2: {writers:?}"
            );
        }
        assert!(
            old.committed.iter().all(|seq| !new.committed.contains(seq)),
            "no seq committed twice"
        );
        if old.fenced {
            fenced_rounds += 1;
        } else {
            assert_eq!(old.committed.len(), TURNS as usize, "round {round}");
        }
        let record = store.get(id).await.unwrap();
        assert_eq!(record.lease_epoch, 2);
        assert_eq!(record.version, log.len() as u64);
    }
    // The older writer only finishes unfenced when it wrote all its turns before the newer
    // wrote any; over twelve racing rounds it is fenced at least once.
    assert!(fenced_rounds > 0, "the race never fenced the older writer");
}

#[tokio::test]
async fn a_frozen_writer_is_fenced_after_a_takeover() {
    let Some(server) = PostgresServer::for_test("a_frozen_writer_is_fenced_after_a_takeover").await
    else {
        return;
    };
    let (store, _database) = fresh(&server).await;
    let id = created(&store).await;
    store
        .append(id, append_of(0, 1, &[lookup_turn(1, 1)]))
        .await
        .unwrap();
    // The old worker reads version 1, then freezes; a new worker (epoch 2) takes over and
    // commits turn 2. The old worker wakes and tries to commit its turn 2 at version 1:
    // the epoch is refused before the version is even looked at.
    store
        .append(id, append_of(1, 2, &[lookup_turn(2, 2)]))
        .await
        .unwrap();
    match store
        .append(id, append_of(1, 1, &[lookup_turn(2, 1)]))
        .await
    {
        Err(StoreError::StaleEpoch {
            presented: 1,
            current: 2,
            ..
        }) => {}
        other => panic!("expected StaleEpoch, got {other:?}"),
    }
    // Even at the right version.
    assert!(matches!(
        store
            .append(id, append_of(2, 1, &[lookup_turn(3, 1)]))
            .await,
        Err(StoreError::StaleEpoch { .. })
    ));
    assert_eq!(store.get(id).await.unwrap().version, 2);
}

#[tokio::test]
async fn the_fencing_trail_orders_each_claim_before_the_commits_of_its_epoch() {
    let Some(server) = PostgresServer::for_test(
        "the_fencing_trail_orders_each_claim_before_the_commits_of_its_epoch",
    )
    .await
    else {
        return;
    };
    let (store, _database) = fresh(&server).await;
    let id = created(&store).await;
    store.claim(id, 1).await.unwrap();
    store
        .append(id, append_of(0, 1, &[lookup_turn(1, 1)]))
        .await
        .unwrap();
    store.claim(id, 2).await.unwrap();
    // A claim at the epoch already held is no new claim.
    store.claim(id, 2).await.unwrap();
    // The worker of epoch 1 is refused, and leaves nothing in the trail.
    assert!(matches!(
        store
            .append(id, append_of(1, 1, &[lookup_turn(2, 1)]))
            .await,
        Err(StoreError::StaleEpoch { .. })
    ));
    store
        .append(id, append_of(1, 2, &[lookup_turn(2, 2), lookup_turn(3, 2)]))
        .await
        .unwrap();

    let trail = store.fencing_trail(0, 100).await.unwrap();
    let steps: Vec<(u64, Option<u64>)> = trail
        .iter()
        .map(|entry| {
            assert_eq!(entry.invocation_id, id);
            (entry.lease_epoch, entry.seq)
        })
        .collect();
    assert_eq!(
        steps,
        [
            (1, None),
            (1, Some(1)),
            (2, None),
            (2, Some(2)),
            (2, Some(3))
        ],
        "claims and commits in the order they took effect"
    );
    assert!(trail.windows(2).all(|w| w[0].position < w[1].position));
    // Paged from a position on.
    let rest = store.fencing_trail(trail[2].position, 2).await.unwrap();
    assert_eq!(rest, trail[3..5]);
}

#[tokio::test]
async fn json_postgres_is_picky_about_round_trips() {
    let Some(server) = PostgresServer::for_test("json_postgres_is_picky_about_round_trips").await
    else {
        return;
    };
    let (store, _database) = fresh(&server).await;
    let id = created(&store).await;
    // A NUL escape (JSONB would refuse it) and key order that JSONB would rewrite.
    let mut event = lookup_turn(1, 1);
    let EventBody::Turn(turn) = &mut event.body else {
        panic!("a turn")
    };
    turn.results = vec![CallResult {
        call_id: CallId::new("call-1"),
        outcome: CallOutcome::Output {
            output_json: "{\"z\":\"nul \\u0000 here\",\"a\":\"\u{0}\"}".to_owned(),
        },
    }];
    store
        .append(id, append_of(0, 1, std::slice::from_ref(&event)))
        .await
        .unwrap();
    let read = store.events(id, 1, 10).await.unwrap();
    assert_eq!(read[0].event, event);
}

#[tokio::test]
async fn corrupt_rows_are_reported_with_the_invocation_and_seq() {
    let Some(server) =
        PostgresServer::for_test("corrupt_rows_are_reported_with_the_invocation_and_seq").await
    else {
        return;
    };
    let (store, database) = fresh(&server).await;
    let new = new_invocation(1_000, None, "d");
    let id = new.invocation_id;
    store.create(new).await.unwrap();
    store
        .append(id, append_of(0, 1, &[lookup_turn(1, 1)]))
        .await
        .unwrap();
    let mut conn = sqlx::PgConnection::connect(database.url()).await.unwrap();
    sqlx::query("UPDATE events SET body = '{\"turn\":' WHERE seq = 1")
        .execute(&mut conn)
        .await
        .unwrap();
    match store.events(id, 1, 10).await {
        Err(StoreError::Corrupt(message)) => {
            assert!(message.contains(&id.to_string()), "{message}");
            assert!(message.contains("event 1"), "{message}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    sqlx::query("UPDATE invocations SET state = 'paused'")
        .execute(&mut conn)
        .await
        .expect_err("the schema refuses an unknown state");
    sqlx::query("UPDATE invocations SET totals = 'not json'")
        .execute(&mut conn)
        .await
        .unwrap();
    match store.get(id).await {
        Err(StoreError::Corrupt(message)) => {
            assert!(message.contains(&id.to_string()), "{message}");
            assert!(message.contains("totals"), "{message}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(
        store.running(None, 10).await.unwrap(),
        [id],
        "other reads still work"
    );
}

#[tokio::test]
async fn a_bad_url_or_missing_database_is_an_error() {
    let Some(server) = PostgresServer::for_test("a_bad_url_or_missing_database_is_an_error").await
    else {
        return;
    };
    assert!(matches!(
        PgStore::connect(PgOptions::new("not a url")).await,
        Err(StoreError::Database(_))
    ));
    let database = server.create_database().await.unwrap();
    let missing = database
        .url()
        .replace(database.name(), "agentloop_test_missing");
    assert!(matches!(
        PgStore::connect(PgOptions::new(missing)).await,
        Err(StoreError::Database(_))
    ));
}

/// A database written before the spec moved out of the invocation row (migrations 1 and
/// 2) keeps its invocations through the upgrade, spec and digest included, and goes on.
#[tokio::test]
async fn a_database_from_before_the_spec_moved_is_upgraded_whole() {
    let Some(server) =
        PostgresServer::for_test("a_database_from_before_the_spec_moved_is_upgraded_whole").await
    else {
        return;
    };
    let database = server.create_database().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let old = earlier_migrations("postgres", 2, dir.path()).await;
    let mut conn = sqlx::PgConnection::connect(database.url()).await.unwrap();
    old.run(&mut conn).await.unwrap();
    let id = conformance::write_earlier_row(&mut conn).await;
    conn.close().await.unwrap();

    conformance::earlier_row_goes_on(&store_on(&database).await, id).await;
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
    until_queued(appends.as_mut(), count, || hold.queued()).await;
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
    let ids = new_invocations(&store, 50).await;
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
    let groups = every_verdict_in_one_group(&store, async |count, appends| {
        held_then_released(&store, count, appends).await
    })
    .await;
    assert_eq!(
        groups, 2,
        "the second appends to two invocations wait for a group of their own"
    );
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
    let behind_the_back = async |id: Uuid| {
        let mut conn = sqlx::PgConnection::connect(database.url()).await.unwrap();
        sqlx::query(
            "INSERT INTO events (invocation_id, seq, committed_at, body) \
             VALUES ($1::uuid, 1, 0, '{}')",
        )
        .bind(id.hyphenated().to_string())
        .execute(&mut conn)
        .await
        .unwrap();
    };
    let groups = a_broken_append_fails_alone(&store, behind_the_back, async |count, appends| {
        held_then_released(&store, count, appends).await
    })
    .await;
    assert_eq!(groups, 1);
}

/// Connections left idle past `PING_AFTER_IDLE` are pinged before they are lent, so a
/// connection the server dropped meanwhile (a restart, a proxy's timeout) is replaced
/// instead of failing the next statement, and the group of turns it carries.
#[tokio::test]
async fn connections_dropped_while_idle_are_replaced_before_use() {
    let Some(server) =
        PostgresServer::for_test("connections_dropped_while_idle_are_replaced_before_use").await
    else {
        return;
    };
    let (store, database) = fresh(&server).await;
    let id = new_invocations(&store, 1).await[0];
    store
        .append(id, append_of(0, 1, &[lookup_turn(1, 1)]))
        .await
        .unwrap();
    let mut admin = sqlx::PgConnection::connect(server.admin_url())
        .await
        .unwrap();
    let dropped: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(database.name())
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(
        dropped.len() >= 2,
        "the store's and its committer's connections"
    );
    // The condition under test: the pool's connections idle beyond the threshold.
    tokio::time::sleep(agentloop_store::PING_AFTER_IDLE + Duration::from_millis(100)).await;
    store
        .append(id, append_of(1, 1, &[lookup_turn(2, 2)]))
        .await
        .unwrap();
    assert_eq!(store.get(id).await.unwrap().version, 2);
}
