//! `LedgerStore` on a temporary SQLite file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use agentloop_ledger::state::TransitionError;
use agentloop_ledger::store::{MAX_DETAIL_BYTES, MAX_ID_BYTES};
use agentloop_ledger::{
    EffectState, LedgerError, LedgerStore, NewEffect, Outcome, StoreOptions, effect_key,
};

async fn open(dir: &tempfile::TempDir) -> LedgerStore {
    LedgerStore::open(&dir.path().join("ledger.sqlite3"), &StoreOptions::default())
        .await
        .unwrap()
}

fn effect(invocation: &str, call: &str) -> NewEffect {
    NewEffect {
        invocation_id: invocation.into(),
        call_id: call.into(),
        effect_key: effect_key(invocation, call),
        tool: "crm.update".into(),
    }
}

#[tokio::test]
async fn full_life_survives_reopen_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let new = effect("inv", "c1");

    let (entry, created) = store.prepare(&new).await.unwrap();
    assert!(created);
    assert_eq!((entry.state, entry.attempt), (EffectState::Prepared, 0));

    let entry = store
        .mark_dispatched(&new.effect_key, EffectState::Prepared)
        .await
        .unwrap();
    assert_eq!((entry.state, entry.attempt), (EffectState::Dispatched, 1));

    let entry = store
        .record(
            &new.effect_key,
            EffectState::Dispatched,
            Outcome::Committed,
            "rcpt-9",
            "ok",
        )
        .await
        .unwrap();
    assert_eq!(entry.state, EffectState::Committed);
    assert_eq!(
        (entry.receipt.as_str(), entry.detail.as_str()),
        ("rcpt-9", "ok")
    );
    assert!(entry.updated_at >= entry.created_at);
    store.close().await;

    let store = open(&dir).await; // migrations are idempotent
    let again = store.get(&new.effect_key).await.unwrap();
    assert_eq!(again, entry);
    store.close().await;

    // WAL is a property of the file, so a raw connection sees it (synchronous=FULL is per
    // connection and set by `LedgerStore::open`; it cannot be observed from here).
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(&format!(
        "sqlite://{}",
        dir.path().join("ledger.sqlite3").display()
    ))
    .await
    .unwrap();
    let (mode,): (String,) = sqlx::query_as("PRAGMA journal_mode")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn reconciliation_paths_out_of_outcome_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let new = effect("inv", "c1");
    store.prepare(&new).await.unwrap();
    store
        .mark_dispatched(&new.effect_key, EffectState::Prepared)
        .await
        .unwrap();
    store
        .record(
            &new.effect_key,
            EffectState::Dispatched,
            Outcome::OutcomeUnknown,
            "",
            "timeout",
        )
        .await
        .unwrap();
    // Reconcile: not applied -> dispatch again.
    let entry = store
        .mark_dispatched(&new.effect_key, EffectState::OutcomeUnknown)
        .await
        .unwrap();
    assert_eq!((entry.state, entry.attempt), (EffectState::Dispatched, 2));
    assert_eq!(entry.detail, "", "detail belongs to the last transition");
    store
        .record(
            &new.effect_key,
            EffectState::Dispatched,
            Outcome::OutcomeUnknown,
            "",
            "timeout",
        )
        .await
        .unwrap();
    // Reconcile: applied -> committed.
    let entry = store
        .record(
            &new.effect_key,
            EffectState::OutcomeUnknown,
            Outcome::Committed,
            "r",
            "",
        )
        .await
        .unwrap();
    assert_eq!((entry.state, entry.attempt), (EffectState::Committed, 2));
}

#[tokio::test]
async fn illegal_and_unguarded_transitions_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let new = effect("inv", "c1");
    let (before, _) = store.prepare(&new).await.unwrap();

    // Guard does not hold (someone else's view of the entry).
    let err = store
        .record(
            &new.effect_key,
            EffectState::Dispatched,
            Outcome::Committed,
            "",
            "",
        )
        .await
        .unwrap_err();
    match err {
        LedgerError::Transition {
            source: TransitionError::NotInExpectedState { expected, found },
            ..
        } => assert_eq!(
            (expected, found),
            (EffectState::Dispatched, EffectState::Prepared)
        ),
        other => panic!("unexpected {other:?}"),
    }
    // No such edge.
    let err = store
        .record(
            &new.effect_key,
            EffectState::Prepared,
            Outcome::Committed,
            "",
            "",
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LedgerError::Transition {
                source: TransitionError::Illegal {
                    from: EffectState::Prepared,
                    to: EffectState::Committed
                },
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(store.get(&new.effect_key).await.unwrap(), before);

    // Dispatch twice: the second one loses.
    store
        .mark_dispatched(&new.effect_key, EffectState::Prepared)
        .await
        .unwrap();
    let err = store
        .mark_dispatched(&new.effect_key, EffectState::Prepared)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("expected state PREPARED, but the entry is DISPATCHED"),
        "{err}"
    );
    assert_eq!(store.get(&new.effect_key).await.unwrap().attempt, 1);
}

#[tokio::test]
async fn concurrent_dispatches_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let new = effect("inv", "race");
    store.prepare(&new).await.unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            let key = new.effect_key.clone();
            tokio::spawn(async move { store.mark_dispatched(&key, EffectState::Prepared).await })
        })
        .collect();
    let mut wins = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => wins += 1,
            Err(LedgerError::Transition { .. }) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(wins, 1);
    assert_eq!(store.get(&new.effect_key).await.unwrap().attempt, 1);
}

#[tokio::test]
async fn prepare_is_idempotent_per_owner() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let new = effect("inv", "c1");
    let (first, created) = store.prepare(&new).await.unwrap();
    assert!(created);
    let (second, created) = store.prepare(&new).await.unwrap();
    assert!(!created);
    assert_eq!(first, second);

    let mut other_owner = new.clone();
    other_owner.call_id = "c2".into();
    let err = store.prepare(&other_owner).await.unwrap_err();
    assert!(matches!(err, LedgerError::AlreadyExists { .. }), "{err:?}");
    let mut other_tool = new.clone();
    other_tool.tool = "mail.send".into();
    assert!(matches!(
        store.prepare(&other_tool).await.unwrap_err(),
        LedgerError::AlreadyExists { .. }
    ));
    assert_eq!(store.get(&new.effect_key).await.unwrap(), first);
}

#[tokio::test]
async fn bad_input_is_refused_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let long = "x".repeat(MAX_ID_BYTES + 1);
    let cases = [
        (
            "invocation_id",
            NewEffect {
                invocation_id: String::new(),
                ..effect("i", "c")
            },
        ),
        (
            "call_id",
            NewEffect {
                call_id: long.clone(),
                ..effect("i", "c")
            },
        ),
        (
            "effect_key",
            NewEffect {
                effect_key: "a\u{0}b".into(),
                ..effect("i", "c")
            },
        ),
        (
            "tool",
            NewEffect {
                tool: String::new(),
                ..effect("i", "c")
            },
        ),
    ];
    for (field, new) in cases {
        match store.prepare(&new).await.unwrap_err() {
            LedgerError::InvalidArgument { field: f, .. } => assert_eq!(f, field),
            other => panic!("unexpected {other:?}"),
        }
    }
    let page = store.list_unresolved(None, 0, None).await.unwrap();
    assert!(page.entries.is_empty());

    let new = effect("i", "c");
    store.prepare(&new).await.unwrap();
    store
        .mark_dispatched(&new.effect_key, EffectState::Prepared)
        .await
        .unwrap();
    let too_long_detail = "d".repeat(MAX_DETAIL_BYTES + 1);
    for (expected_field, receipt, detail, outcome) in [
        ("detail", "", too_long_detail.as_str(), Outcome::Rejected),
        ("receipt", long.as_str(), "", Outcome::Committed),
        ("receipt", "r", "", Outcome::Rejected),
    ] {
        match store
            .record(
                &new.effect_key,
                EffectState::Dispatched,
                outcome,
                receipt,
                detail,
            )
            .await
            .unwrap_err()
        {
            LedgerError::InvalidArgument { field, .. } => assert_eq!(field, expected_field),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        store.get(&new.effect_key).await.unwrap().state,
        EffectState::Dispatched
    );
    assert!(matches!(
        store.get("nope").await.unwrap_err(),
        LedgerError::NotFound { .. }
    ));
}

#[tokio::test]
async fn list_unresolved_pages_oldest_first_and_filters() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let mut keys = Vec::new();
    for i in 0..7 {
        let invocation = if i % 2 == 0 { "even" } else { "odd" };
        let new = effect(invocation, &format!("c{i}"));
        store.prepare(&new).await.unwrap();
        keys.push(new.effect_key);
    }
    // Resolve c2: it must not be listed.
    store
        .mark_dispatched(&keys[2], EffectState::Prepared)
        .await
        .unwrap();
    store
        .record(
            &keys[2],
            EffectState::Dispatched,
            Outcome::Rejected,
            "",
            "no",
        )
        .await
        .unwrap();

    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = store
            .list_unresolved(None, 2, token.as_deref())
            .await
            .unwrap();
        assert!(page.entries.len() <= 2);
        pages += 1;
        seen.extend(page.entries.into_iter().map(|e| e.call_id));
        match page.next_page_token {
            Some(next) => token = Some(next),
            None => break,
        }
        assert!(pages < 10, "paging does not end");
    }
    assert_eq!(seen, ["c0", "c1", "c3", "c4", "c5", "c6"]);
    assert_eq!(pages, 3);

    let even = store.list_unresolved(Some("even"), 0, None).await.unwrap();
    let calls: Vec<_> = even.entries.iter().map(|e| e.call_id.as_str()).collect();
    assert_eq!(calls, ["c0", "c4", "c6"]);
    assert_eq!(even.next_page_token, None);

    assert!(matches!(
        store
            .list_unresolved(None, 2, Some("garbage"))
            .await
            .unwrap_err(),
        LedgerError::InvalidArgument {
            field: "page_token",
            ..
        }
    ));
}
