//! The ledger on SQLite: the conformance suite (each check on a file of its own), and
//! what only this backend has to get right: WAL with `synchronous=FULL`, reopening, and
//! upgrading a file made before RECONCILIATION_REQUIRED existed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

mod conformance;

use agentloop_ledger::{Backend, EffectState, LedgerStore, Outcome, StoreOptions};
use conformance::{effect, unknown_outcome};
use sqlx::Connection;

async fn open(dir: &tempfile::TempDir) -> LedgerStore {
    LedgerStore::open_sqlite(&dir.path().join("ledger.sqlite3"), &StoreOptions::default())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_passes_the_conformance_suite() {
    conformance::run_all(|| async {
        let dir = tempfile::tempdir().unwrap();
        (open(&dir).await, dir)
    })
    .await;
}

#[tokio::test]
async fn entries_survive_reopen_in_wal_mode_with_full_sync() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    assert_eq!(store.backend(), Backend::Sqlite);
    assert_eq!(
        store.durability().await.unwrap(),
        "journal_mode=wal synchronous=full"
    );
    let new = effect("inv", "c1");
    let flagged = unknown_outcome(&store, &new).await;
    store.close().await;

    let store = open(&dir).await; // migrations are idempotent
    assert_eq!(store.get(&new.effect_key).await.unwrap(), flagged);
    store.close().await;
}

/// A ledger file written by the first schema (before RECONCILIATION_REQUIRED) keeps its
/// entries and their order when the second migration rebuilds the table, and new entries
/// still sort after them.
#[tokio::test]
async fn a_file_from_the_first_schema_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.sqlite3");
    let url = format!("sqlite://{}?mode=rwc", path.display());
    {
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::migrate!("./migrations/sqlite")
            .run_to(1, &mut conn)
            .await
            .unwrap();
        for (seq, call, state) in [(1, "old-1", "OUTCOME_UNKNOWN"), (2, "old-2", "COMMITTED")] {
            let new = effect("inv", call);
            sqlx::query(
                "INSERT INTO effects (seq, effect_key, invocation_id, call_id, tool, state, \
                 attempt, created_at_ms, updated_at_ms) VALUES ($1, $2, $3, $4, $5, $6, 1, 10, 20)",
            )
            .bind(seq)
            .bind(&new.effect_key)
            .bind(&new.invocation_id)
            .bind(&new.call_id)
            .bind(&new.tool)
            .bind(state)
            .execute(&mut conn)
            .await
            .unwrap();
        }
        // The first schema refuses the new state.
        assert!(
            sqlx::query("UPDATE effects SET state = 'RECONCILIATION_REQUIRED' WHERE seq = 1")
                .execute(&mut conn)
                .await
                .is_err()
        );
        conn.close().await.unwrap();
    }

    let store = open(&dir).await;
    let old = effect("inv", "old-1");
    let entry = store.get(&old.effect_key).await.unwrap();
    assert_eq!(
        (entry.state, entry.attempt),
        (EffectState::OutcomeUnknown, 1)
    );
    let flagged = store
        .record(
            &old.effect_key,
            EffectState::OutcomeUnknown,
            Outcome::ReconciliationRequired,
            "",
            "cannot tell",
        )
        .await
        .unwrap();
    assert_eq!(flagged.state, EffectState::ReconciliationRequired);
    assert_eq!(
        store
            .get(&effect("inv", "old-2").effect_key)
            .await
            .unwrap()
            .state,
        EffectState::Committed
    );
    store.prepare(&effect("inv", "new-1")).await.unwrap();
    let listed: Vec<_> = store
        .list_unresolved(None, 0, None)
        .await
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.call_id)
        .collect();
    assert_eq!(listed, ["old-1", "new-1"]);
    // The page token after the first entry is still seq 1's: the rebuild kept seqs.
    let page = store.list_unresolved(None, 1, None).await.unwrap();
    let rest = store
        .list_unresolved(None, 1, page.next_page_token.as_deref())
        .await
        .unwrap();
    assert_eq!(rest.entries[0].call_id, "new-1");
    store.close().await;

    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let new_seq: i64 = sqlx::query_scalar("SELECT seq FROM effects WHERE call_id = 'new-1'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        new_seq, 3,
        "AUTOINCREMENT continues after the rebuilt table"
    );
}
