//! The event store of agentloop: invocations and their append-only event logs.
//!
//! One trait, [`EventStore`], with two backends that run the same conformance suite
//! (`conformance`): SQLite ([`SqliteStore`]), the embedded default, and PostgreSQL
//! ([`PgStore`]), which several orchestrator processes on several machines share.
//! [`databases`] creates and drops PostgreSQL databases of one's own (the cluster bench
//! runs on two); `testing` builds on it for the throwaway databases of tests here and in
//! other crates. `conformance` and `testing` exist only with the `test-util` feature, which
//! only `[dev-dependencies]` enable: they panic where a test should fail, so no production
//! build carries them.
//! The store persists what the engine commits — it does not interpret events beyond what
//! it needs to index an invocation (its state and terminal reason).
//!
//! Guarantees every backend gives:
//! - an append is atomic: all of its events or none;
//! - an append names the version it extends (`expected_version`) and fails with
//!   [`StoreError::VersionConflict`] if the log has moved on, so two writers can never both
//!   extend the same log;
//! - an append carries the writer's lease epoch; an epoch older than the newest one seen
//!   for that invocation is refused ([`StoreError::StaleEpoch`]) — fencing;
//! - once `append` returns `Ok`, the events survive a crash (SQLite: WAL with
//!   `synchronous=FULL`; PostgreSQL: `synchronous_commit=on` for every session);
//! - nothing is ever appended after an `Ended` event, except after one that waits for a
//!   human (`EndRecord::waits`): then the reply, or the final end, follows.
#![warn(missing_docs)]

mod codec;
#[cfg(feature = "test-util")]
pub mod conformance;
pub mod databases;
mod pg_commit;
mod postgres;
mod sqlite;
#[cfg(feature = "test-util")]
pub mod testing;
mod writer;

use agentloop_engine::{EndRecord, Event, TerminalReason, Totals, UnixMillis};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use pg_commit::{PgCommitHold, PgCommitStats};
pub use postgres::{
    DEFAULT_MAX_CONNECTIONS, PING_AFTER_IDLE, PgOptions, PgStore, TrailEntry, pg_pool_options,
};
pub use sqlite::{DATABASE_FILE, SqliteDurability, SqliteOptions, SqliteStorage, SqliteStore};
pub use writer::{SqliteStats, WriterHold};

/// Where an invocation is in its life, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvocationState {
    /// Not ended: a worker runs it or will pick it up.
    Running,
    /// Its run stopped to wait for a human (its last event is an `Ended` event that
    /// waits): a reply, a cancel or the end of the wait bound is appended next.
    Waiting,
    /// Its final `Ended` event is committed.
    Ended,
}

/// What the caller asked for, fixed at creation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewInvocation {
    /// The new invocation's ID (UUIDv7: time-ordered, so listings page by creation order).
    pub invocation_id: Uuid,
    /// The tenant that owns it: listings filter by it, and idempotency keys are unique
    /// per tenant, so one tenant's key never finds (or names) another tenant's invocation.
    pub tenant: String,
    /// The caller's idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// Digest of the caller's request, to tell "the same request again" from "the same key
    /// for a different request".
    pub request_digest: String,
    /// The orchestrator's own description of the invocation (goal, profile, limits, ...)
    /// as JSON text; opaque to the store.
    pub spec: String,
    /// When it was accepted.
    pub created_at: UnixMillis,
}

/// An invocation as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvocationRecord {
    /// Its ID.
    pub invocation_id: Uuid,
    /// See [`NewInvocation::tenant`].
    pub tenant: String,
    /// The caller's idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// See [`NewInvocation::request_digest`].
    pub request_digest: String,
    /// See [`NewInvocation::spec`].
    pub spec: String,
    /// Running or ended.
    pub state: InvocationState,
    /// Seq of the last committed event (0 for none).
    pub version: u64,
    /// The newest lease epoch that committed (0 before any).
    pub lease_epoch: u64,
    /// Totals as of the last commit.
    pub totals: Totals,
    /// The end, once ended.
    pub end: Option<EndRecord>,
    /// When a caller asked to cancel it, if one did ([`EventStore::request_cancel`]).
    pub cancel_requested_at: Option<UnixMillis>,
    /// The reason that caller gave (empty for none).
    pub cancel_reason: String,
    /// When it was accepted.
    pub created_at: UnixMillis,
    /// When it last changed.
    pub updated_at: UnixMillis,
}

/// The result of [`EventStore::create`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// A new invocation was stored.
    New(InvocationRecord),
    /// The idempotency key was already used for the same request: this is that invocation.
    Existing(InvocationRecord),
}

/// One append: the events of one engine `Commit`, and what the invocation row must say after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Append<'a> {
    /// The seq of the last event the append extends.
    pub expected_version: u64,
    /// The writer's lease epoch (fencing token).
    pub lease_epoch: u64,
    /// The events, seq `expected_version + 1` onwards.
    pub events: &'a [Event],
    /// The invocation's totals after these events.
    pub totals: Totals,
    /// Commit time.
    pub committed_at: UnixMillis,
}

/// A committed event with its commit time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// When it was committed.
    pub committed_at: UnixMillis,
    /// The event.
    pub event: Event,
}

/// A page request for [`EventStore::list`]; every filter given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListRequest {
    /// Most records to return (the store caps it at [`MAX_PAGE_SIZE`]).
    pub limit: u32,
    /// Only invocations created before this ID (newest first); `None` for the first page.
    pub before: Option<Uuid>,
    /// Only invocations in this state.
    pub state: Option<InvocationState>,
    /// Only invocations of this tenant.
    pub tenant: Option<String>,
    /// Only invocations whose end record (an end, or a wait) has this reason.
    pub reason: Option<TerminalReason>,
    /// Only invocations created at or after this instant.
    pub created_from: Option<UnixMillis>,
    /// Only invocations created before this instant.
    pub created_before: Option<UnixMillis>,
}

/// Largest page any listing returns.
pub const MAX_PAGE_SIZE: u32 = 500;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No invocation with that ID.
    #[error("no invocation {0}")]
    NotFound(Uuid),
    /// The idempotency key was used for a different request.
    #[error(
        "idempotency key {key:?} was already used for a different request (invocation {existing})"
    )]
    IdempotencyConflict {
        /// The key.
        key: String,
        /// The invocation it belongs to.
        existing: Uuid,
    },
    /// The log is not at the version the append extends.
    #[error("invocation {invocation_id} is at version {actual}, not {expected}")]
    VersionConflict {
        /// The invocation.
        invocation_id: Uuid,
        /// The version the append expected.
        expected: u64,
        /// The version the log is at.
        actual: u64,
    },
    /// A newer lease epoch has committed: this writer lost its lease.
    #[error("invocation {invocation_id}: lease epoch {presented} is older than {current}")]
    StaleEpoch {
        /// The invocation.
        invocation_id: Uuid,
        /// The epoch the append carried.
        presented: u64,
        /// The newest epoch seen.
        current: u64,
    },
    /// The invocation has ended for good; nothing more may be appended.
    #[error("invocation {0} has ended")]
    Ended(Uuid),
    /// The events do not continue the log (seq gap, empty append).
    #[error("malformed append: {0}")]
    MalformedAppend(String),
    /// A stored row could not be read back (corruption, incompatible version).
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// The database failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Migrations failed.
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// Invocations and their event logs.
#[async_trait]
pub trait EventStore: Send + Sync + 'static {
    /// Stores a new invocation, or returns the existing one for an idempotency key its
    /// tenant already used, with the same `request_digest`; a different digest is [`StoreError::IdempotencyConflict`].
    async fn create(&self, new: NewInvocation) -> Result<Created, StoreError>;

    /// One invocation.
    async fn get(&self, invocation_id: Uuid) -> Result<InvocationRecord, StoreError>;

    /// A page of invocations, newest first.
    async fn list(&self, request: ListRequest) -> Result<Vec<InvocationRecord>, StoreError>;

    /// Appends the events of one commit atomically, fenced by version and lease epoch, and
    /// updates the invocation (version, epoch, totals; state and end: running, waiting
    /// after an `Ended` event that waits, ended after a final one).
    async fn append(&self, invocation_id: Uuid, append: Append<'_>) -> Result<(), StoreError>;

    /// Up to `limit` committed events with `seq >= from_seq`, in order.
    async fn events(
        &self,
        invocation_id: Uuid,
        from_seq: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError>;

    /// IDs of invocations that have not ended, in ID order (UUIDv7: oldest first), after
    /// `after` if given, up to `limit` (capped at [`MAX_PAGE_SIZE`]): for resuming work
    /// after a restart and for the orphan sweep, which pages through all of them.
    async fn running(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<Uuid>, StoreError>;

    /// Fences the invocation for a worker that just acquired its lease with `lease_epoch`:
    /// from now on an append with an older epoch is refused ([`StoreError::StaleEpoch`]),
    /// even before the new worker commits anything, so a worker paused past its lease can
    /// never commit after another took over. Returns the invocation as stored after the
    /// claim (an ended invocation is returned unchanged: there is nothing to run). A
    /// claim with an epoch older than the newest seen is `StaleEpoch`; the same epoch
    /// again is a no-op.
    async fn claim(
        &self,
        invocation_id: Uuid,
        lease_epoch: u64,
    ) -> Result<InvocationRecord, StoreError>;

    /// Records durably that a caller asked to cancel the invocation, with `reason`, so
    /// whichever worker runs it next ends it `cancelled`. Idempotent: the first request's
    /// time and reason are kept. An ended invocation is returned unchanged.
    async fn request_cancel(
        &self,
        invocation_id: Uuid,
        at: UnixMillis,
        reason: &str,
    ) -> Result<InvocationRecord, StoreError>;

    /// IDs of waiting invocations whose wait bound passed by `now`, soonest first, up to
    /// `limit` (capped at [`MAX_PAGE_SIZE`]).
    async fn expired_waits(&self, now: UnixMillis, limit: u32) -> Result<Vec<Uuid>, StoreError>;

    /// How many invocations wait for a human, by the reason their run stopped
    /// (`approval_required`, `clarification_required`); a reason absent has none.
    /// Counted over the index of waiting invocations, for the metrics.
    async fn count_waiting(&self) -> Result<Vec<(TerminalReason, u64)>, StoreError>;
}

/// The rows of a `count_waiting` query (reason name, count) as its answer. A row whose
/// reason does not parse is corrupt.
pub(crate) fn waiting_counts(
    rows: Vec<(Option<String>, i64)>,
) -> Result<Vec<(TerminalReason, u64)>, StoreError> {
    rows.into_iter()
        .map(|(reason, count)| {
            let reason = reason.unwrap_or_default();
            let parsed = reason.parse::<TerminalReason>().map_err(|_| {
                StoreError::Corrupt(format!("a waiting invocation ended {reason:?}"))
            })?;
            Ok((parsed, u64::try_from(count).unwrap_or_default()))
        })
        .collect()
}
