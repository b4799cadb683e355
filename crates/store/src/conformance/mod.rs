//! The behaviour every [`EventStore`] backend must show, as a test suite backends run.
//!
//! Each check is a `pub async fn` taking a fresh, empty store; [`run_all`] runs every
//! check in [`CHECKS`] on its own store (with the one runner of every suite,
//! [`agentloop_testkit::conformance::run_checks`]) and names the check that failed. A
//! backend's integration test needs only a factory:
//!
//! ```no_run
//! # async fn example() {
//! use agentloop_store::{SqliteStore, conformance};
//! conformance::run_all(|| async {
//!     let dir = tempfile::tempdir().unwrap();
//!     let store = SqliteStore::open_in(dir.path()).await.unwrap();
//!     (store, dir) // the guard (here the temp dir) lives as long as the check
//! })
//! .await;
//! # }
//! ```
//!
//! Checks must run inside a multi-threaded-capable Tokio runtime (one spawns tasks).
//! They assert only what the [`EventStore`] documentation promises, so PostgreSQL runs the
//! same functions.

// This module is a test suite shipped for backends: a broken expectation is reported by
// panicking, exactly as in a test.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod append;
mod claims;
mod create;
mod fencing;
mod fixtures;
mod listing;
mod upgrade;
mod waits;

use std::sync::Arc;

use agentloop_testkit::conformance::{Check, run_checks};

use crate::EventStore;

pub use append::{append_and_read_every_kind, events_paging, malformed_appends_write_nothing};
pub use claims::{
    cancel_requests_are_durable, claim_fences_older_epochs, concurrent_claims_newest_wins,
};
pub use create::{concurrent_creates_one_key, create_get_round_trip, idempotent_create, not_found};
pub use fencing::{
    append_after_ended_refused, concurrent_appends_one_wins, lease_epoch_fencing, version_conflict,
};
pub use fixtures::{TENANT, append_of, every_kind_of_event, id_at, lookup_turn, new_invocation};
pub use listing::{list_paging, running_oldest_first, tenants_apart};
pub use upgrade::{EARLIER_ROW, earlier_row_goes_on, write_earlier_row};
pub use waits::waits_for_humans;

/// Every check, by name, in the order [`run_all`] runs them; each gets a fresh store.
pub const CHECKS: &[Check<Arc<dyn EventStore>>] = &[
    ("create_get_round_trip", |s| {
        Box::pin(create_get_round_trip(s))
    }),
    ("idempotent_create", |s| Box::pin(idempotent_create(s))),
    ("concurrent_creates_one_key", |s| {
        Box::pin(concurrent_creates_one_key(s))
    }),
    ("append_and_read_every_kind", |s| {
        Box::pin(append_and_read_every_kind(s))
    }),
    ("events_paging", |s| Box::pin(events_paging(s))),
    ("version_conflict", |s| Box::pin(version_conflict(s))),
    ("concurrent_appends_one_wins", |s| {
        Box::pin(concurrent_appends_one_wins(s))
    }),
    ("lease_epoch_fencing", |s| Box::pin(lease_epoch_fencing(s))),
    ("append_after_ended_refused", |s| {
        Box::pin(append_after_ended_refused(s))
    }),
    ("malformed_appends_write_nothing", |s| {
        Box::pin(malformed_appends_write_nothing(s))
    }),
    ("list_paging", |s| Box::pin(list_paging(s))),
    ("tenants_apart", |s| Box::pin(tenants_apart(s))),
    ("running_oldest_first", |s| {
        Box::pin(running_oldest_first(s))
    }),
    ("claim_fences_older_epochs", |s| {
        Box::pin(claim_fences_older_epochs(s))
    }),
    ("concurrent_claims_newest_wins", |s| {
        Box::pin(concurrent_claims_newest_wins(s))
    }),
    ("cancel_requests_are_durable", |s| {
        Box::pin(cancel_requests_are_durable(s))
    }),
    ("waits_for_humans", |s| Box::pin(waits_for_humans(s))),
    ("not_found", |s| Box::pin(not_found(s))),
];

/// Runs every check in [`CHECKS`], each on a store from `make`.
///
/// `make` returns the store and a guard dropped after the check (a temp dir, a database
/// to drop); a failing check panics with its name.
pub async fn run_all<S: EventStore, G>(mut make: impl AsyncFnMut() -> (S, G)) {
    let make = async || {
        let (store, guard) = make().await;
        (Arc::new(store) as Arc<dyn EventStore>, guard)
    };
    // `close` is not part of the trait: the store is dropped with its last `Arc`, and the
    // guard (a temp dir, `DROP DATABASE ... WITH (FORCE)`) copes with what it leaves open.
    run_checks("event store", CHECKS, make, async |_| {}).await;
}
