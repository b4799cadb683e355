//! Worker leases for agentloop: who may run an invocation right now, with a fencing epoch.
//!
//! One trait, [`LeaseBackend`], with two backends that pass the same test suite
//! (`conformance`): [`RedisLeases`] (several orchestrator processes share one Redis) and
//! [`InProcessLeases`] (the embedded default, one process). A worker's [`Keepers`] keeps
//! every lease it acquired alive (one batch of renewals per period) and fires an
//! invocation's cancellation token (its [`Keeper`]) the moment the lease is lost or
//! revoked.
//!
//! [`TenantPlaces`] bounds a tenant's running invocations and start rate across every
//! worker of a backend, each place following its invocation's lease ([`RedisLeases`]).
//!
//! [`Handoff`] is the queue through which a worker that gives work up (it drains) tells idle
//! workers to take it now; it is only a hint, the lease decides.
//!
//! The test suite and `testing` (a throwaway `redis-server`) exist only with the
//! `test-util` feature, which only `[dev-dependencies]` enable: they panic where a test
//! should fail, so no production build carries them.
//!
//! What this crate is not: it does not decide *which* invocation a worker should run (no
//! sweep, no scheduling) and it does not enforce fencing itself. A lease is advisory — the event
//! store enforces it by refusing commits that carry an epoch older than the newest it saw.
//! That is why [`Lease::epoch`] exists and why it must never go backwards.
//!
//! Guarantees every backend gives:
//! - at most one live lease per key at any instant (the backend's clock decides expiry);
//! - [`Lease::epoch`] strictly increases per key over all successful acquisitions, and an
//!   epoch is consumed only by a successful acquisition;
//! - renew and release act only when the caller holds exactly that lease (owner *and*
//!   epoch), so a worker that was paused past its TTL cannot extend or delete its
//!   successor's lease;
//! - [`LeaseBackend::revoke`] deletes the lease and tells every subscriber, so the holder
//!   can stop at once instead of at its next renewal.
#![warn(missing_docs)]

#[cfg(feature = "test-util")]
pub mod conformance;
mod error;
mod handoff;
mod keeper;
mod memory;
mod places;
mod redis_backend;
#[cfg(feature = "test-util")]
pub mod testing;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast;

pub use error::LeaseError;
pub use handoff::{Handoff, InProcessHandoff, MAX_QUEUED, RedisHandoff};
pub use keeper::{Keeper, KeeperConfig, KeeperExit, Keepers};
pub use memory::InProcessLeases;
pub use places::{Admission, PlaceLimits, TenantPlaces};
pub use redis_backend::{REVOCATION_CHANNEL, RedisLeaseConfig, RedisLeases};

/// The longest TTL a backend accepts: a lease is a liveness signal, not a reservation, so
/// a day-long TTL is a bug (a dead worker would block its invocation for that long).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// How many revoked keys a subscriber may fall behind before it sees
/// [`broadcast::error::RecvError::Lagged`]; a lagging [`Keepers`] renews at once to find out
/// whether its own lease was among them.
pub const REVOCATION_BUFFER: usize = 1024;

/// A held lease: proof that `owner` may run the work named by `key` until the TTL passes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    /// What is leased (for the orchestrator: the invocation ID).
    pub key: String,
    /// Who holds it (a worker ID, unique per process and run). Shared: a worker holds
    /// many leases, and the in-process backend gives them all its one copy.
    pub owner: Arc<str>,
    /// The fencing token: larger than every epoch handed out for `key` before. Commits
    /// carry it so the store can refuse a stale holder.
    pub epoch: u64,
}

impl Lease {
    /// The value a backend stores for this lease; renew and release compare against it,
    /// so owner and epoch must both match.
    pub fn token(&self) -> String {
        format!("{}:{}", self.owner, self.epoch)
    }
}

/// A stream of revoked keys (every key, not only the subscriber's): filter by key.
///
/// A subscription sees every revocation made after [`LeaseBackend::subscribe_revocations`]
/// returned, unless the backend lost its connection meanwhile (Redis pub/sub is
/// fire-and-forget). A revocation deletes the lease, so a holder that missed the message
/// still learns at its next renewal; [`Keepers`] relies on that.
pub type Revocations = broadcast::Receiver<String>;

/// A lease store. Object-safe: workers hold an `Arc<dyn LeaseBackend>`.
///
/// `ttl` must be between 1 ms and [`MAX_TTL`]; keys and owners must be non-empty and at
/// most [`MAX_NAME_LEN`] bytes ([`LeaseError::InvalidArgument`] otherwise).
#[async_trait]
pub trait LeaseBackend: Send + Sync + std::fmt::Debug {
    /// Takes the lease on `key` for `ttl`, or returns `None` while someone (including
    /// `owner` itself) holds an unexpired lease on it.
    async fn acquire(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, LeaseError>;

    /// Extends `lease` to `ttl` from now. `false`: the lease is gone (expired, released,
    /// revoked or taken over) and the holder must stop.
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, LeaseError>;

    /// [`LeaseBackend::renew`] for many leases at once (a worker's [`Keepers`] renews all
    /// of its leases every period); one answer per lease, in order. The default renews
    /// them one by one; a networked backend sends them together.
    async fn renew_many(
        &self,
        leases: &[Arc<Lease>],
        ttl: Duration,
    ) -> Result<Vec<bool>, LeaseError> {
        let mut answers = Vec::with_capacity(leases.len());
        for lease in leases {
            answers.push(self.renew(lease, ttl).await?);
        }
        Ok(answers)
    }

    /// Gives `lease` up early so another worker need not wait for the TTL. `false`: it was
    /// no longer held (nothing was deleted).
    async fn release(&self, lease: &Lease) -> Result<bool, LeaseError>;

    /// Deletes whatever lease is held on `key` and notifies every subscriber. `true`: a
    /// lease was deleted. Subscribers are notified either way, so a holder whose lease
    /// just expired still stops.
    async fn revoke(&self, key: &str) -> Result<bool, LeaseError>;

    /// Subscribes to revocations. When this returns `Ok`, every later revocation reaches
    /// the receiver (see [`Revocations`] for what a lost connection does).
    async fn subscribe_revocations(&self) -> Result<Revocations, LeaseError>;
}

/// The longest key or owner a backend accepts, in bytes.
pub const MAX_NAME_LEN: usize = 512;

/// Checks the arguments every backend validates the same way.
fn validate(key: &str, owner: Option<&str>, ttl: Option<Duration>) -> Result<(), LeaseError> {
    if key.is_empty() || key.len() > MAX_NAME_LEN {
        return Err(LeaseError::InvalidArgument(format!(
            "lease key must be 1..={MAX_NAME_LEN} bytes, got {}",
            key.len()
        )));
    }
    if let Some(owner) = owner
        && (owner.is_empty() || owner.len() > MAX_NAME_LEN)
    {
        return Err(LeaseError::InvalidArgument(format!(
            "lease owner must be 1..={MAX_NAME_LEN} bytes, got {}",
            owner.len()
        )));
    }
    if let Some(ttl) = ttl
        && (ttl < Duration::from_millis(1) || ttl > MAX_TTL)
    {
        return Err(LeaseError::InvalidArgument(format!(
            "lease ttl must be between 1 ms and {MAX_TTL:?}, got {ttl:?}"
        )));
    }
    Ok(())
}

/// Microseconds since the Unix epoch: the floor for new epochs in the in-process backend
/// (see [`InProcessLeases`]). A clock before 1970 gives 0, which only drops the floor.
fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
