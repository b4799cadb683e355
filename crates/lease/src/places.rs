//! A tenant's places across every worker that shares a backend: how many of its
//! invocations run at once, and how fast it starts them, so that N orchestrators do not
//! let a tenant run N times its bound.
//!
//! A place follows the lease: it counts while its invocation's lease lives, or for a
//! short reservation after it was taken (the time between admitting a start and taking
//! its lease). A worker that loses its lease stops holding the place with it, whatever it
//! believes, and a crashed worker's places lapse with its leases: the same discipline as
//! the leases' own, with the lease's epoch as the fence. A place is freed at once when its
//! invocation stops running for good, and a worker that runs an invocation again (a resume,
//! a takeover) holds its place again without being refused.

use std::time::Duration;

use async_trait::async_trait;

use crate::LeaseError;

/// A tenant's bounds, as the backend enforces them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaceLimits {
    /// Places one tenant may hold at once; 0 for no bound.
    pub max_running: u32,
    /// Starts one tenant may make per second, on average; 0 for no bound.
    pub starts_per_s: u32,
    /// Starts one tenant may make at once after a quiet spell.
    pub start_burst: u32,
    /// How long a place counts without a live lease on its key: from admission until the
    /// lease is taken, or after a resume.
    pub reserve_for: Duration,
}

impl PlaceLimits {
    /// Whether any bound is set.
    pub fn is_on(&self) -> bool {
        self.max_running > 0 || self.starts_per_s > 0
    }
}

/// What [`TenantPlaces::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A place and a start token were taken.
    Admitted,
    /// The tenant holds `limit` places already.
    Full {
        /// Its bound.
        limit: u32,
    },
    /// The tenant started `per_s` a second for a while; one more fits in `retry_ms`.
    TooFast {
        /// Its rate.
        per_s: u32,
        /// When a token is there again.
        retry_ms: u64,
    },
}

/// Places shared by every worker of a backend. Keys are the lease keys (invocation IDs).
#[async_trait]
pub trait TenantPlaces: Send + Sync + std::fmt::Debug {
    /// A start of `key` for `tenant`: takes a place and a start token together, or
    /// neither and says which bound refused.
    async fn admit(
        &self,
        tenant: &str,
        key: &str,
        limits: &PlaceLimits,
    ) -> Result<Admission, LeaseError>;

    /// `key` of `tenant` runs here again (a resume, a takeover): its place, never refused.
    async fn hold(&self, tenant: &str, key: &str, limits: &PlaceLimits) -> Result<(), LeaseError>;

    /// `key` of `tenant` stopped running for good (it ended, or waits for a human): its
    /// place is free now.
    async fn free(&self, tenant: &str, key: &str) -> Result<(), LeaseError>;
}
