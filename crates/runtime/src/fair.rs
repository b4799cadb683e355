//! Fair use per tenant: a bound on each tenant's running invocations and a token bucket
//! on its starts, so that one tenant cannot take the orchestrator from the others.
//!
//! When the workers share a lease backend that keeps places ([`TenantPlaces`], Redis),
//! the bounds hold across every orchestrator of the cluster and are kept there, each
//! place following its invocation's lease; this process then counts nothing itself.
//! Otherwise they hold in this process, counted here.
//!
//! A start takes a [`Ticket`] before anything is stored, and the runner keeps it until it
//! is forgotten, as the global slots do: concurrent starts of one tenant cannot pass its
//! bound together. An invocation taken over from another worker (or resumed) counts for
//! its tenant too, but is never refused: it was accepted once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agentloop_lease::{Admission, PlaceLimits, TenantPlaces};
use tracing::warn;
use uuid::Uuid;

use crate::config::TenantLimits;
use crate::error::RuntimeError;

/// Tenants kept without running invocations before idle ones are dropped; an idle
/// tenant's bucket is full again, so dropping it changes nothing.
const MAX_IDLE_TENANTS: usize = 10_000;

/// Why a tenant's start was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The tenant runs `limit` invocations already.
    Running { limit: usize },
    /// The tenant started `per_s` a second for a while; one more fits in `retry_ms`.
    Rate { per_s: u32, retry_ms: u64 },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Running { limit } => write!(
                f,
                "the tenant runs {limit} invocations, its bound (tenants.max_running); \
                 retry when one ends"
            ),
            Refusal::Rate { per_s, retry_ms } => write!(
                f,
                "the tenant starts more than {per_s} invocations a second \
                 (tenants.starts_per_s); retry in {retry_ms} ms"
            ),
        }
    }
}

/// A token bucket over monotonic milliseconds: `burst` tokens, refilled at `per_s`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Tokens, in thousandths (integer arithmetic, no drift).
    milli_tokens: u64,
    /// When it was last refilled.
    at_ms: u64,
}

impl Bucket {
    fn full(burst: u32, now_ms: u64) -> Bucket {
        Bucket {
            milli_tokens: u64::from(burst) * 1000,
            at_ms: now_ms,
        }
    }

    /// Takes one token, or says how long until one is there.
    fn take(&mut self, per_s: u32, burst: u32, now_ms: u64) -> Result<(), u64> {
        let elapsed = now_ms.saturating_sub(self.at_ms);
        // per_s tokens a second is per_s thousandths a millisecond.
        let refill = elapsed.saturating_mul(u64::from(per_s));
        self.milli_tokens = self
            .milli_tokens
            .saturating_add(refill)
            .min(u64::from(burst) * 1000);
        self.at_ms = now_ms;
        if self.milli_tokens >= 1000 {
            self.milli_tokens -= 1000;
            Ok(())
        } else {
            let missing = 1000 - self.milli_tokens;
            Err(missing.div_ceil(u64::from(per_s).max(1)))
        }
    }

    fn is_full(&self, per_s: u32, burst: u32, now_ms: u64) -> bool {
        let refill = now_ms
            .saturating_sub(self.at_ms)
            .saturating_mul(u64::from(per_s));
        self.milli_tokens.saturating_add(refill) >= u64::from(burst) * 1000
    }
}

#[derive(Debug)]
struct Usage {
    running: usize,
    bucket: Bucket,
}

/// Each tenant's running invocations and start bucket: in this process, or across the
/// cluster.
#[derive(Debug)]
pub(crate) struct Tenants {
    limits: TenantLimits,
    origin: Instant,
    usage: Mutex<HashMap<Arc<str>, Usage>>,
    /// The places every worker shares, and the bounds they keep; `None` when the bounds
    /// hold in this process (or are off).
    cluster: Option<(Arc<dyn TenantPlaces>, PlaceLimits)>,
}

impl Tenants {
    /// Bounds in this process.
    #[cfg(test)]
    pub(crate) fn new(limits: TenantLimits) -> Tenants {
        Tenants::shared(limits, None, Duration::ZERO)
    }

    /// Bounds across the cluster when `places` is given (a place without a lease counts
    /// for `reserve_for`), else in this process.
    pub(crate) fn shared(
        limits: TenantLimits,
        places: Option<Arc<dyn TenantPlaces>>,
        reserve_for: Duration,
    ) -> Tenants {
        let cluster_limits = PlaceLimits {
            max_running: u32::try_from(limits.max_running).unwrap_or(u32::MAX),
            starts_per_s: limits.starts_per_s,
            start_burst: limits.start_burst,
            reserve_for,
        };
        Tenants {
            limits,
            origin: Instant::now(),
            usage: Mutex::new(HashMap::new()),
            cluster: places
                .filter(|_| cluster_limits.is_on())
                .map(|places| (places, cluster_limits)),
        }
    }

    /// Whether this process counts nothing: the bounds are off, or the cluster keeps them.
    fn is_off(&self) -> bool {
        self.cluster.is_some() || (self.limits.max_running == 0 && self.limits.starts_per_s == 0)
    }

    /// A start of invocation `id` of `tenant`, admitted across the cluster or in this
    /// process.
    ///
    /// # Errors
    ///
    /// `ResourceExhausted` with the bound that refused it; the places' backend's error
    /// when it cannot tell.
    pub(crate) async fn admit_start(
        &self,
        tenant: &str,
        id: Uuid,
    ) -> Result<Ticket<'_>, RuntimeError> {
        let Some((places, limits)) = &self.cluster else {
            return self
                .admit(tenant)
                .map_err(|refusal| RuntimeError::ResourceExhausted(refusal.to_string()));
        };
        let refusal = match places.admit(tenant, &id.to_string(), limits).await? {
            Admission::Admitted => return Ok(Ticket::none(self)),
            Admission::Full { limit } => Refusal::Running {
                limit: usize::try_from(limit).unwrap_or(usize::MAX),
            },
            Admission::TooFast { per_s, retry_ms } => Refusal::Rate { per_s, retry_ms },
        };
        Err(RuntimeError::ResourceExhausted(refusal.to_string()))
    }

    /// Invocation `id` of `tenant` runs here again (a resume, a takeover): counted, never
    /// refused. A backend that does not answer is logged: its place then counts again at
    /// the next start that finds its lease alive.
    pub(crate) async fn hold_again(&self, tenant: &str, id: Uuid) -> Ticket<'_> {
        if let Some((places, limits)) = &self.cluster
            && let Err(error) = places.hold(tenant, &id.to_string(), limits).await
        {
            warn!(invocation = %id, %error, "the tenant's place was not held again");
        }
        self.hold(tenant)
    }

    /// Invocation `id` of `tenant` stopped running for good (it ended, or it waits for a
    /// human): its place in the cluster is free now, not when its lease lapses.
    pub(crate) async fn ended(&self, tenant: &str, id: Uuid) {
        if let Some((places, _)) = &self.cluster
            && let Err(error) = places.free(tenant, &id.to_string()).await
        {
            warn!(invocation = %id, %error, "the tenant's place is freed when its lease lapses");
        }
    }

    fn burst(&self) -> u32 {
        match self.limits.start_burst {
            0 => self.limits.starts_per_s,
            burst => burst,
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A start of `tenant` in this process: takes a token and a running place, or says
    /// which bound refused it (and then takes neither).
    fn admit(&self, tenant: &str) -> Result<Ticket<'_>, Refusal> {
        if self.is_off() {
            return Ok(Ticket::none(self));
        }
        let now = self.now_ms();
        let (per_s, burst) = (self.limits.starts_per_s, self.burst());
        let mut usage = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        if usage.len() > MAX_IDLE_TENANTS {
            usage.retain(|_, u| u.running > 0 || !u.bucket.is_full(per_s, burst, now));
        }
        let entry = match usage.get_mut(tenant) {
            Some(entry) => entry,
            None => usage.entry(Arc::from(tenant)).or_insert(Usage {
                running: 0,
                bucket: Bucket::full(burst, now),
            }),
        };
        let limit = self.limits.max_running;
        if limit > 0 && entry.running >= limit {
            return Err(Refusal::Running { limit });
        }
        if per_s > 0 {
            entry
                .bucket
                .take(per_s, burst, now)
                .map_err(|retry_ms| Refusal::Rate { per_s, retry_ms })?;
        }
        entry.running += 1;
        Ok(Ticket {
            tenants: self,
            tenant: Some(Arc::from(tenant)),
        })
    }

    /// An invocation of `tenant` this process takes up (resume, takeover): counted,
    /// never refused.
    fn hold(&self, tenant: &str) -> Ticket<'_> {
        if self.is_off() {
            return Ticket::none(self);
        }
        let now = self.now_ms();
        let burst = self.burst();
        let mut usage = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        usage
            .entry(Arc::from(tenant))
            .or_insert(Usage {
                running: 0,
                bucket: Bucket::full(burst, now),
            })
            .running += 1;
        Ticket {
            tenants: self,
            tenant: Some(Arc::from(tenant)),
        }
    }

    /// A kept ticket's invocation stopped running here.
    pub(crate) fn release(&self, tenant: &str) {
        if self.is_off() {
            return;
        }
        let mut usage = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = usage.get_mut(tenant) {
            entry.running = entry.running.saturating_sub(1);
        }
    }

    #[cfg(test)]
    fn running(&self, tenant: &str) -> usize {
        let usage = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        usage.get(tenant).map_or(0, |u| u.running)
    }
}

/// A tenant's running place, given back when dropped unless [`Ticket::keep`] hands it to
/// a runner (which gives it back through [`Tenants::release`] when it is forgotten).
#[derive(Debug)]
pub(crate) struct Ticket<'a> {
    tenants: &'a Tenants,
    /// `None` when the bounds are off: nothing to give back.
    tenant: Option<Arc<str>>,
}

impl Ticket<'_> {
    fn none(tenants: &Tenants) -> Ticket<'_> {
        Ticket {
            tenants,
            tenant: None,
        }
    }

    /// Hands the place to a runner, which gives it back with [`Tenants::release`] when
    /// it is forgotten.
    pub(crate) fn keep(mut self) {
        self.tenant = None;
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if let Some(tenant) = self.tenant.take() {
            self.tenants.release(&tenant);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_running: usize, starts_per_s: u32, start_burst: u32) -> TenantLimits {
        TenantLimits {
            max_running,
            starts_per_s,
            start_burst,
        }
    }

    #[test]
    fn a_bucket_gives_its_burst_then_refills_at_its_rate() {
        let mut bucket = Bucket::full(3, 0);
        for _ in 0..3 {
            assert_eq!(bucket.take(10, 3, 0), Ok(()));
        }
        // 10 a second: one every 100 ms.
        assert_eq!(bucket.take(10, 3, 0), Err(100));
        assert_eq!(bucket.take(10, 3, 40), Err(60));
        assert_eq!(bucket.take(10, 3, 100), Ok(()));
        // Never more than the burst, however long the pause.
        assert!(bucket.is_full(10, 3, 1_000_000));
        let mut rested = bucket;
        for _ in 0..3 {
            assert_eq!(rested.take(10, 3, 1_000_000), Ok(()));
        }
        assert!(rested.take(10, 3, 1_000_000).is_err());
    }

    #[test]
    fn a_tenant_runs_at_most_its_bound_and_others_are_not_affected() {
        let tenants = Tenants::new(limits(2, 0, 0));
        let first = tenants.admit("a").unwrap();
        let second = tenants.admit("a").unwrap();
        assert_eq!(
            tenants.admit("a").unwrap_err(),
            Refusal::Running { limit: 2 }
        );
        let other = tenants.admit("b").unwrap();
        // A dropped ticket (a start that stored nothing) gives its place back.
        drop(second);
        tenants.admit("a").unwrap().keep();
        assert_eq!(tenants.running("a"), 2);
        // Adoption counts but is never refused.
        tenants.hold("a").keep();
        assert_eq!(tenants.running("a"), 3);
        drop((first, other));
        tenants.release("a");
        tenants.release("a");
        assert_eq!(tenants.running("a"), 0);
    }

    #[test]
    fn a_refused_start_takes_neither_a_token_nor_a_place() {
        let tenants = Tenants::new(limits(1, 1, 5));
        tenants.admit("a").unwrap().keep();
        for _ in 0..10 {
            assert!(matches!(tenants.admit("a"), Err(Refusal::Running { .. })));
        }
        tenants.release("a");
        // The bucket still holds the four tokens the first start left.
        for _ in 0..4 {
            tenants.admit("a").unwrap().keep();
            tenants.release("a");
        }
        assert!(matches!(
            tenants.admit("a"),
            Err(Refusal::Rate { per_s: 1, .. })
        ));
    }

    #[test]
    fn off_bounds_count_nothing() {
        let tenants = Tenants::new(TenantLimits::default());
        for _ in 0..100 {
            tenants.admit("a").unwrap().keep();
            tenants.release("a");
        }
        assert_eq!(tenants.running("a"), 0);
        assert!(
            tenants
                .usage
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_empty(),
            "nothing is kept while the bounds are off"
        );
    }
}
