//! What every ledger backend must do, as checks that `tests/sqlite.rs` and
//! `tests/postgres.rs` both run: each check gets a fresh, empty [`LedgerStore`] from the
//! backend's factory, and [`run_all`] names the check that failed (with the one runner of
//! every suite, [`agentloop_testkit::conformance::run_checks`]).
//!
//! The checks assert only what `LedgerStore` documents, so the same functions hold both
//! backends to the same guarantees: guarded transitions, idempotent prepare, bounds,
//! both listings (unresolved entries; every entry of one invocation) and their paging, the
//! operator's RECONCILIATION_REQUIRED path, and exactly one winner when many
//! tasks race the same transition on the same key. They spawn tasks, so they need a
//! multi-threaded Tokio runtime.

use std::sync::Arc;

use agentloop_ledger::state::TransitionError;
use agentloop_ledger::store::{DEFAULT_PAGE_SIZE, MAX_DETAIL_BYTES, MAX_ID_BYTES};
use agentloop_ledger::{EffectState, Entry, LedgerError, LedgerStore, NewEffect, Outcome};
use agentloop_testkit::conformance::{Check, run_checks};
use tokio::sync::Barrier;

/// Every check, by name, in the order [`run_all`] runs them; each gets a fresh store.
const CHECKS: &[Check<LedgerStore>] = &[
    ("full_life", |s| Box::pin(full_life(s))),
    ("reconciliation_paths_out_of_outcome_unknown", |s| {
        Box::pin(reconciliation_paths_out_of_outcome_unknown(s))
    }),
    ("reconciliation_required_waits_for_an_operator", |s| {
        Box::pin(reconciliation_required_waits_for_an_operator(s))
    }),
    ("illegal_and_unguarded_transitions_change_nothing", |s| {
        Box::pin(illegal_and_unguarded_transitions_change_nothing(s))
    }),
    ("prepare_is_idempotent_per_owner", |s| {
        Box::pin(prepare_is_idempotent_per_owner(s))
    }),
    ("bad_input_is_refused_and_nothing_is_stored", |s| {
        Box::pin(bad_input_is_refused_and_nothing_is_stored(s))
    }),
    ("list_unresolved_pages_oldest_first_and_filters", |s| {
        Box::pin(list_unresolved_pages_oldest_first_and_filters(s))
    }),
    ("list_by_invocation_lists_every_state_oldest_first", |s| {
        Box::pin(list_by_invocation_lists_every_state_oldest_first(s))
    }),
    ("list_by_invocation_pages_each_entry_exactly_once", |s| {
        Box::pin(list_by_invocation_pages_each_entry_exactly_once(s))
    }),
    ("page_sizes_default_and_cap", |s| {
        Box::pin(page_sizes_default_and_cap(s))
    }),
    ("racing_the_same_transition_exactly_one_wins", |s| {
        Box::pin(racing_the_same_transition_exactly_one_wins(s))
    }),
];

/// Runs every check on a store from `make`, which also returns a guard (a temp dir, a
/// database to drop) that lives until the check is over.
pub(crate) async fn run_all<G>(make: impl AsyncFnMut() -> (LedgerStore, G)) {
    // Closed before the guard goes, so the temp dir or the database is removed with no
    // connection to it open.
    run_checks("ledger", CHECKS, make, async |store: LedgerStore| {
        store.close().await;
    })
    .await;
}

/// A new effect with the default key of (`invocation`, `call`).
pub(crate) fn effect(invocation: &str, call: &str) -> NewEffect {
    NewEffect {
        invocation_id: invocation.into(),
        call_id: call.into(),
        effect_key: agentloop_ledger::effect_key(invocation, call),
        tool: "crm.update".into(),
    }
}

/// Prepares, dispatches and records OUTCOME_UNKNOWN: where reconciliation starts.
pub(crate) async fn unknown_outcome(store: &LedgerStore, new: &NewEffect) -> Entry {
    store.prepare(new).await.unwrap();
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
            "deadline exceeded",
        )
        .await
        .unwrap()
}

fn assert_not_in_expected_state(
    error: &LedgerError,
    expected_state: EffectState,
    found_state: EffectState,
) {
    match error {
        LedgerError::Transition {
            source: TransitionError::NotInExpectedState { expected, found },
            ..
        } => assert_eq!((*expected, *found), (expected_state, found_state)),
        other => panic!("expected NotInExpectedState, got {other:?}"),
    }
}

fn assert_illegal(error: &LedgerError, from_state: EffectState, to_state: EffectState) {
    match error {
        LedgerError::Transition {
            source: TransitionError::Illegal { from, to },
            ..
        } => assert_eq!((*from, *to), (from_state, to_state)),
        other => panic!("expected Illegal, got {other:?}"),
    }
}

async fn full_life(store: LedgerStore) {
    let new = effect("inv", "c1");
    let (entry, created) = store.prepare(&new).await.unwrap();
    assert!(created);
    assert_eq!((entry.state, entry.attempt), (EffectState::Prepared, 0));
    assert_eq!(
        (
            entry.invocation_id.as_str(),
            entry.call_id.as_str(),
            entry.tool.as_str()
        ),
        ("inv", "c1", "crm.update")
    );

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
    assert_eq!(store.get(&new.effect_key).await.unwrap(), entry);
    assert!(
        store
            .list_unresolved(None, 0, None)
            .await
            .unwrap()
            .entries
            .is_empty()
    );
}

async fn reconciliation_paths_out_of_outcome_unknown(store: LedgerStore) {
    let new = effect("inv", "c1");
    unknown_outcome(&store, &new).await;
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
    // "Still unknown" is not a transition.
    let err = store
        .record(
            &new.effect_key,
            EffectState::OutcomeUnknown,
            Outcome::OutcomeUnknown,
            "",
            "still",
        )
        .await
        .unwrap_err();
    assert_illegal(
        &err,
        EffectState::OutcomeUnknown,
        EffectState::OutcomeUnknown,
    );
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

async fn reconciliation_required_waits_for_an_operator(store: LedgerStore) {
    let new = effect("inv", "c1");
    let unknown = unknown_outcome(&store, &new).await;

    // Only a reconcile can hand an effect to an operator: not straight from DISPATCHED...
    let other = effect("inv", "c2");
    store.prepare(&other).await.unwrap();
    store
        .mark_dispatched(&other.effect_key, EffectState::Prepared)
        .await
        .unwrap();
    let err = store
        .record(
            &other.effect_key,
            EffectState::Dispatched,
            Outcome::ReconciliationRequired,
            "",
            "why",
        )
        .await
        .unwrap_err();
    assert_illegal(
        &err,
        EffectState::Dispatched,
        EffectState::ReconciliationRequired,
    );
    // ...and never without saying why.
    for detail in ["", "  "] {
        match store
            .record(
                &new.effect_key,
                EffectState::OutcomeUnknown,
                Outcome::ReconciliationRequired,
                "",
                detail,
            )
            .await
            .unwrap_err()
        {
            LedgerError::InvalidArgument { field, .. } => assert_eq!(field, "detail"),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(store.get(&new.effect_key).await.unwrap(), unknown);

    let flagged = store
        .record(
            &new.effect_key,
            EffectState::OutcomeUnknown,
            Outcome::ReconciliationRequired,
            "",
            "executor has no record of the key and cannot tell",
        )
        .await
        .unwrap();
    assert_eq!(flagged.state, EffectState::ReconciliationRequired);
    assert_eq!(flagged.attempt, 1, "flagging is not a dispatch");
    assert_eq!(
        flagged.detail,
        "executor has no record of the key and cannot tell"
    );

    // Listed for the operator, with the reason, alone or among the invocation's entries.
    let listed = store.list_unresolved(Some("inv"), 0, None).await.unwrap();
    let states: Vec<_> = listed
        .entries
        .iter()
        .map(|e| (e.call_id.as_str(), e.state))
        .collect();
    assert_eq!(
        states,
        [
            ("c1", EffectState::ReconciliationRequired),
            ("c2", EffectState::Dispatched)
        ]
    );
    assert_eq!(listed.entries[0], flagged);

    // The runtime may not touch it again: no dispatch, no "unknown", no second flag.
    let err = store
        .mark_dispatched(&new.effect_key, EffectState::ReconciliationRequired)
        .await
        .unwrap_err();
    assert_illegal(
        &err,
        EffectState::ReconciliationRequired,
        EffectState::Dispatched,
    );
    let err = store
        .mark_dispatched(&new.effect_key, EffectState::OutcomeUnknown)
        .await
        .unwrap_err();
    assert_not_in_expected_state(
        &err,
        EffectState::OutcomeUnknown,
        EffectState::ReconciliationRequired,
    );
    for outcome in [Outcome::OutcomeUnknown, Outcome::ReconciliationRequired] {
        let err = store
            .record(
                &new.effect_key,
                EffectState::ReconciliationRequired,
                outcome,
                "",
                "again",
            )
            .await
            .unwrap_err();
        assert_illegal(&err, EffectState::ReconciliationRequired, outcome.state());
    }
    // A reconcile answer that arrives late, guarded by the old state, loses.
    let err = store
        .record(
            &new.effect_key,
            EffectState::OutcomeUnknown,
            Outcome::Committed,
            "",
            "",
        )
        .await
        .unwrap_err();
    assert_not_in_expected_state(
        &err,
        EffectState::OutcomeUnknown,
        EffectState::ReconciliationRequired,
    );
    assert_eq!(store.get(&new.effect_key).await.unwrap(), flagged);

    // The operator settles it with a guarded Record.
    let settled = store
        .record(
            &new.effect_key,
            EffectState::ReconciliationRequired,
            Outcome::Committed,
            "ledger-row-77",
            "operator: found in the CRM audit log",
        )
        .await
        .unwrap();
    assert_eq!(settled.state, EffectState::Committed);
    assert_eq!(settled.receipt, "ledger-row-77");
    assert_eq!(settled.attempt, 1);
    let listed = store.list_unresolved(None, 0, None).await.unwrap();
    assert_eq!(listed.entries.len(), 1);
    assert_eq!(listed.entries[0].call_id, "c2");

    // REJECTED is the operator's other answer.
    let third = effect("inv", "c3");
    unknown_outcome(&store, &third).await;
    store
        .record(
            &third.effect_key,
            EffectState::OutcomeUnknown,
            Outcome::ReconciliationRequired,
            "",
            "executor unreachable",
        )
        .await
        .unwrap();
    let rejected = store
        .record(
            &third.effect_key,
            EffectState::ReconciliationRequired,
            Outcome::Rejected,
            "",
            "operator: not applied",
        )
        .await
        .unwrap();
    assert_eq!(rejected.state, EffectState::Rejected);
}

async fn illegal_and_unguarded_transitions_change_nothing(store: LedgerStore) {
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
    assert_not_in_expected_state(&err, EffectState::Dispatched, EffectState::Prepared);
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
    assert_illegal(&err, EffectState::Prepared, EffectState::Committed);
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

    // Terminal states have no way out.
    store
        .record(
            &new.effect_key,
            EffectState::Dispatched,
            Outcome::Rejected,
            "",
            "no",
        )
        .await
        .unwrap();
    let err = store
        .mark_dispatched(&new.effect_key, EffectState::Rejected)
        .await
        .unwrap_err();
    assert_illegal(&err, EffectState::Rejected, EffectState::Dispatched);
    assert!(matches!(
        store
            .mark_dispatched("no-such-key", EffectState::Prepared)
            .await
            .unwrap_err(),
        LedgerError::NotFound { .. }
    ));
}

async fn prepare_is_idempotent_per_owner(store: LedgerStore) {
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

    // A prepare of an entry that has moved on returns it as it is now.
    store
        .mark_dispatched(&new.effect_key, EffectState::Prepared)
        .await
        .unwrap();
    let (again, created) = store.prepare(&new).await.unwrap();
    assert!(!created);
    assert_eq!(again.state, EffectState::Dispatched);
}

async fn bad_input_is_refused_and_nothing_is_stored(store: LedgerStore) {
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
    // The longest allowed values fit both backends' columns.
    let longest = NewEffect {
        invocation_id: "i".repeat(MAX_ID_BYTES),
        call_id: "c".repeat(MAX_ID_BYTES),
        effect_key: "k".repeat(MAX_ID_BYTES),
        tool: "t".repeat(MAX_ID_BYTES),
    };
    assert!(store.prepare(&longest).await.unwrap().1);
    let page = store.list_unresolved(None, 0, None).await.unwrap();
    assert_eq!(page.entries.len(), 1, "only the valid one was stored");

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
    let longest_detail = "d".repeat(MAX_DETAIL_BYTES);
    let entry = store
        .record(
            &new.effect_key,
            EffectState::Dispatched,
            Outcome::Rejected,
            "",
            &longest_detail,
        )
        .await
        .unwrap();
    assert_eq!(entry.detail.len(), MAX_DETAIL_BYTES);
    assert!(matches!(
        store.get("nope").await.unwrap_err(),
        LedgerError::NotFound { .. }
    ));
    assert!(matches!(
        store.list_unresolved(Some(""), 0, None).await.unwrap_err(),
        LedgerError::InvalidArgument {
            field: "invocation_id",
            ..
        }
    ));
}

async fn list_unresolved_pages_oldest_first_and_filters(store: LedgerStore) {
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
    // c4 waits for an operator: still listed.
    store
        .mark_dispatched(&keys[4], EffectState::Prepared)
        .await
        .unwrap();
    store
        .record(
            &keys[4],
            EffectState::Dispatched,
            Outcome::OutcomeUnknown,
            "",
            "lost",
        )
        .await
        .unwrap();
    store
        .record(
            &keys[4],
            EffectState::OutcomeUnknown,
            Outcome::ReconciliationRequired,
            "",
            "cannot tell",
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
        if pages == 1 {
            // Resolving an entry of a page already returned does not shift later pages.
            store
                .mark_dispatched(&keys[0], EffectState::Prepared)
                .await
                .unwrap();
            store
                .record(
                    &keys[0],
                    EffectState::Dispatched,
                    Outcome::Committed,
                    "",
                    "",
                )
                .await
                .unwrap();
        }
        seen.extend(page.entries.into_iter().map(|e| (e.call_id, e.state)));
        match page.next_page_token {
            Some(next) => token = Some(next),
            None => break,
        }
        assert!(pages < 10, "paging does not end");
    }
    let calls: Vec<_> = seen.iter().map(|(call, _)| call.as_str()).collect();
    assert_eq!(calls, ["c0", "c1", "c3", "c4", "c5", "c6"]);
    assert_eq!(seen[3].1, EffectState::ReconciliationRequired);
    assert_eq!(pages, 3);

    let even = store.list_unresolved(Some("even"), 0, None).await.unwrap();
    let calls: Vec<_> = even.entries.iter().map(|e| e.call_id.as_str()).collect();
    assert_eq!(calls, ["c4", "c6"]);
    assert_eq!(even.next_page_token, None);
    let none = store
        .list_unresolved(Some("no-such-invocation"), 0, None)
        .await
        .unwrap();
    assert!(none.entries.is_empty());
    assert_eq!(none.next_page_token, None);

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

/// Drives the prepared effect `key` into `state` along the shortest legal path.
async fn move_to(store: &LedgerStore, key: &str, state: EffectState) {
    let dispatch = async || {
        store
            .mark_dispatched(key, EffectState::Prepared)
            .await
            .unwrap();
    };
    let record = async |expected, outcome, receipt, detail| {
        store
            .record(key, expected, outcome, receipt, detail)
            .await
            .unwrap();
    };
    match state {
        EffectState::Prepared => {}
        EffectState::Dispatched => dispatch().await,
        EffectState::Committed => {
            dispatch().await;
            record(EffectState::Dispatched, Outcome::Committed, "rcpt", "").await;
        }
        EffectState::Rejected => {
            dispatch().await;
            record(EffectState::Dispatched, Outcome::Rejected, "", "no").await;
        }
        EffectState::OutcomeUnknown => {
            dispatch().await;
            record(EffectState::Dispatched, Outcome::OutcomeUnknown, "", "lost").await;
        }
        EffectState::ReconciliationRequired => {
            dispatch().await;
            record(EffectState::Dispatched, Outcome::OutcomeUnknown, "", "lost").await;
            record(
                EffectState::OutcomeUnknown,
                Outcome::ReconciliationRequired,
                "",
                "cannot tell",
            )
            .await;
        }
    }
}

async fn list_by_invocation_lists_every_state_oldest_first(store: LedgerStore) {
    // Call IDs out of alphabetical order, and another invocation's entries prepared in
    // between, so only the preparation order and the invocation filter give this list.
    let states = [
        ("prepared", EffectState::Prepared),
        ("dispatched", EffectState::Dispatched),
        ("committed", EffectState::Committed),
        ("rejected", EffectState::Rejected),
        ("unknown", EffectState::OutcomeUnknown),
        ("flagged", EffectState::ReconciliationRequired),
    ];
    for (call, _) in states {
        store.prepare(&effect("inv", call)).await.unwrap();
        store.prepare(&effect("other", call)).await.unwrap();
    }
    // Moved newest first, so listing by last change would give the reverse order.
    for (call, state) in states.into_iter().rev() {
        move_to(&store, &effect("inv", call).effect_key, state).await;
    }
    move_to(
        &store,
        &effect("other", "committed").effect_key,
        EffectState::Committed,
    )
    .await;

    let page = store.list_by_invocation("inv", 0, None).await.unwrap();
    assert_eq!(page.next_page_token, None);
    let listed: Vec<_> = page
        .entries
        .iter()
        .map(|e| (e.call_id.as_str(), e.state))
        .collect();
    assert_eq!(listed, states);
    for entry in &page.entries {
        assert_eq!(entry.invocation_id, "inv");
        assert_eq!(&store.get(&entry.effect_key).await.unwrap(), entry);
    }
    assert_eq!(page.entries[2].receipt, "rcpt");
    assert_eq!(page.entries[5].detail, "cannot tell");

    let other = store.list_by_invocation("other", 0, None).await.unwrap();
    assert!(other.entries.iter().all(|e| e.invocation_id == "other"));
    assert_eq!(other.entries.len(), states.len());

    let none = store
        .list_by_invocation("no-such-invocation", 0, None)
        .await
        .unwrap();
    assert!(none.entries.is_empty());
    assert_eq!(none.next_page_token, None);

    for bad in [
        String::new(),
        "x".repeat(MAX_ID_BYTES + 1),
        "a\nb".to_owned(),
    ] {
        assert!(
            matches!(
                store.list_by_invocation(&bad, 0, None).await.unwrap_err(),
                LedgerError::InvalidArgument {
                    field: "invocation_id",
                    ..
                }
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        store
            .list_by_invocation("inv", 2, Some("garbage"))
            .await
            .unwrap_err(),
        LedgerError::InvalidArgument {
            field: "page_token",
            ..
        }
    ));
}

async fn list_by_invocation_pages_each_entry_exactly_once(store: LedgerStore) {
    let mut prepared = Vec::new();
    for i in 0..7 {
        let new = effect("inv", &format!("c{i}"));
        store.prepare(&new).await.unwrap();
        store
            .prepare(&effect("other", &format!("c{i}")))
            .await
            .unwrap();
        prepared.push(new.call_id);
    }
    move_to(
        &store,
        &effect("inv", "c1").effect_key,
        EffectState::Committed,
    )
    .await;

    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = store
            .list_by_invocation("inv", 2, token.as_deref())
            .await
            .unwrap();
        assert!(page.entries.len() <= 2);
        pages += 1;
        if pages == 1 {
            // Entries changing state between pages neither vanish nor come back: this
            // listing does not filter on state, and the cursor is the preparation order.
            move_to(
                &store,
                &effect("inv", "c0").effect_key,
                EffectState::Rejected,
            )
            .await;
            move_to(
                &store,
                &effect("inv", "c4").effect_key,
                EffectState::Committed,
            )
            .await;
        }
        seen.extend(page.entries.into_iter().map(|e| e.call_id));
        match page.next_page_token {
            Some(next) => token = Some(next),
            None => break,
        }
        assert!(pages < 10, "paging does not end");
    }
    assert_eq!(seen, prepared);
    assert_eq!(pages, 4);

    // A page that ends exactly at the last entry says so: no token for an empty page.
    let whole = store
        .list_by_invocation("inv", prepared.len() as u32, None)
        .await
        .unwrap();
    assert_eq!(whole.entries.len(), prepared.len());
    assert_eq!(whole.next_page_token, None);
}

async fn page_sizes_default_and_cap(store: LedgerStore) {
    let total = DEFAULT_PAGE_SIZE as usize + 1;
    for i in 0..total {
        store
            .prepare(&effect("many", &format!("c{i}")))
            .await
            .unwrap();
    }
    let first = store.list_unresolved(None, 0, None).await.unwrap();
    assert_eq!(first.entries.len(), DEFAULT_PAGE_SIZE as usize);
    let rest = store
        .list_unresolved(None, 0, first.next_page_token.as_deref())
        .await
        .unwrap();
    assert_eq!(rest.entries.len(), 1);
    assert_eq!(rest.entries[0].call_id, format!("c{}", total - 1));
    assert_eq!(rest.next_page_token, None);
    // A huge page size is capped, not an error.
    let all = store.list_unresolved(None, u32::MAX, None).await.unwrap();
    assert_eq!(all.entries.len(), total);
    assert_eq!(all.next_page_token, None);

    // ListByInvocation pages by the same sizes.
    let first = store.list_by_invocation("many", 0, None).await.unwrap();
    assert_eq!(first.entries.len(), DEFAULT_PAGE_SIZE as usize);
    let rest = store
        .list_by_invocation("many", 0, first.next_page_token.as_deref())
        .await
        .unwrap();
    assert_eq!(rest.entries.len(), 1);
    assert_eq!(rest.entries[0].call_id, format!("c{}", total - 1));
    assert_eq!(rest.next_page_token, None);
    let all = store
        .list_by_invocation("many", u32::MAX, None)
        .await
        .unwrap();
    assert_eq!(all.entries.len(), total);
    assert_eq!(all.next_page_token, None);
}

/// How many tasks race each transition.
const RACERS: usize = 32;

/// Starts `RACERS` tasks that wait at one barrier and then run `attempt(i)` at once.
async fn race<F, Fut>(attempt: F) -> Vec<Result<Entry, LedgerError>>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<Entry, LedgerError>> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let barrier = barrier.clone();
            let attempt = attempt(i);
            tokio::spawn(async move {
                barrier.wait().await;
                attempt.await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(RACERS);
    for task in tasks {
        results.push(task.await.unwrap());
    }
    results
}

/// Exactly one `Ok`; every loser refused by the guard (not by storage trouble), naming
/// the state the winner left.
fn one_winner(
    results: Vec<Result<Entry, LedgerError>>,
    expected: EffectState,
    what: &str,
) -> Entry {
    let mut winners = Vec::new();
    for result in results {
        match result {
            Ok(entry) => winners.push(entry),
            Err(LedgerError::Transition {
                source: TransitionError::NotInExpectedState { expected: e, found },
                ..
            }) => {
                assert_eq!(e, expected, "{what}");
                assert_ne!(found, expected, "{what}: a loser saw the guard hold");
            }
            Err(other) => panic!("{what}: a loser failed with {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "{what}: {winners:?}");
    winners.remove(0)
}

async fn racing_the_same_transition_exactly_one_wins(store: LedgerStore) {
    let new = effect("inv", "race");
    let key = new.effect_key.clone();

    // Prepare: every racer gets the one entry, exactly one created it.
    let barrier = Arc::new(Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|_| {
            let (store, new, barrier) = (store.clone(), new.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.prepare(&new).await
            })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        let (entry, was_created) = task.await.unwrap().unwrap();
        assert_eq!(entry.effect_key, key);
        created += usize::from(was_created);
    }
    assert_eq!(created, 1, "prepare");

    // Dispatch: one attempt, not RACERS.
    let won = one_winner(
        race(|_| {
            let (store, key) = (store.clone(), key.clone());
            async move { store.mark_dispatched(&key, EffectState::Prepared).await }
        })
        .await,
        EffectState::Prepared,
        "dispatch",
    );
    assert_eq!((won.state, won.attempt), (EffectState::Dispatched, 1));

    // Outcomes that disagree: the stored one is the winner's.
    let outcomes = [
        Outcome::Committed,
        Outcome::Rejected,
        Outcome::OutcomeUnknown,
    ];
    let won = one_winner(
        race(|i| {
            let (store, key) = (store.clone(), key.clone());
            let outcome = outcomes[i % outcomes.len()];
            async move {
                store
                    .record(
                        &key,
                        EffectState::Dispatched,
                        outcome,
                        "",
                        &format!("racer {i}"),
                    )
                    .await
            }
        })
        .await,
        EffectState::Dispatched,
        "record",
    );
    assert_eq!(store.get(&key).await.unwrap(), won);

    // From OUTCOME_UNKNOWN: reconcilers racing each other (redispatch, flag, settle),
    // then operators racing to settle the flagged effect.
    let other = effect("inv", "race-2");
    let other_key = other.effect_key.clone();
    unknown_outcome(&store, &other).await;
    let won = one_winner(
        race(|i| {
            let (store, key) = (store.clone(), other_key.clone());
            async move {
                match i % 3 {
                    0 => {
                        store
                            .mark_dispatched(&key, EffectState::OutcomeUnknown)
                            .await
                    }
                    1 => {
                        store
                            .record(
                                &key,
                                EffectState::OutcomeUnknown,
                                Outcome::ReconciliationRequired,
                                "",
                                "cannot tell",
                            )
                            .await
                    }
                    _ => {
                        store
                            .record(
                                &key,
                                EffectState::OutcomeUnknown,
                                Outcome::Committed,
                                "",
                                "",
                            )
                            .await
                    }
                }
            }
        })
        .await,
        EffectState::OutcomeUnknown,
        "reconcile",
    );
    assert_eq!(store.get(&other_key).await.unwrap(), won);

    let third = effect("inv", "race-3");
    let third_key = third.effect_key.clone();
    unknown_outcome(&store, &third).await;
    store
        .record(
            &third_key,
            EffectState::OutcomeUnknown,
            Outcome::ReconciliationRequired,
            "",
            "cannot tell",
        )
        .await
        .unwrap();
    let won = one_winner(
        race(|i| {
            let (store, key) = (store.clone(), third_key.clone());
            let outcome = if i % 2 == 0 {
                Outcome::Committed
            } else {
                Outcome::Rejected
            };
            async move {
                store
                    .record(
                        &key,
                        EffectState::ReconciliationRequired,
                        outcome,
                        "",
                        &format!("operator {i}"),
                    )
                    .await
            }
        })
        .await,
        EffectState::ReconciliationRequired,
        "operator",
    );
    assert!(matches!(
        won.state,
        EffectState::Committed | EffectState::Rejected
    ));
    assert_eq!(store.get(&third_key).await.unwrap(), won);
}
