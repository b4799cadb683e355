//! Sharing invocations between orchestrator processes ("workers").
//!
//! Each running invocation is run by the one worker holding its lease, and every commit
//! carries the lease's epoch, which the event store fences on. A worker takes work three
//! ways: it accepts a new invocation (`StartInvocation`), it takes a key another worker
//! handed off (a draining worker offers what it parks), or its periodic sweep of the store
//! finds a running invocation whose lease nobody holds (its worker died). All three go
//! through [`crate::Orchestrator::adopt`]: acquire the lease, claim the epoch in the store,
//! then run from the last committed event.

use std::sync::Arc;
use std::time::Duration;

use agentloop_lease::{
    Handoff, InProcessHandoff, InProcessLeases, KeeperConfig, Keepers, LeaseBackend, LeaseError,
    RedisHandoff, RedisLeaseConfig, RedisLeases, TenantPlaces,
};
use tokio::sync::OnceCell;
use uuid::Uuid;

use crate::config::WorkersConfig;

/// The Redis list of handed-off invocation IDs.
const HANDOFF_KEY: &str = "agentloop:runnable";
/// How long one take from the hand-off queue waits; also how quickly the taking loop
/// notices a drain.
const HANDOFF_WAIT: Duration = Duration::from_secs(1);
/// Bound on every Redis command but the blocking take.
const REDIS_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// Running invocations read per page by the sweep.
pub(crate) const SWEEP_PAGE: u32 = 500;
/// The pause before the hand-off loop tries again after its backend failed.
pub(crate) const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// How this process takes part in running invocations: its leases, its hand-off queue,
/// its name and its timings.
#[derive(Debug, Clone)]
pub struct Workers {
    pub(crate) leases: Arc<dyn LeaseBackend>,
    pub(crate) handoff: Arc<dyn Handoff>,
    pub(crate) id: String,
    pub(crate) ttl: Duration,
    pub(crate) sweep_every: Duration,
    /// The tenants' places every worker shares (Redis), so that the tenants' bounds hold
    /// across the cluster; `None` keeps them in each process.
    pub(crate) places: Option<Arc<dyn TenantPlaces>>,
    /// Whether other processes share these leases. Alone, nothing can orphan an
    /// invocation while the process lives, so the periodic sweep and the hand-off loop
    /// do not run (the sweep at start still resumes what a previous run left).
    pub(crate) shared: bool,
    /// Renews every lease this worker holds; started on first use.
    keepers: Arc<OnceCell<Keepers>>,
}

impl Workers {
    /// In-process leases and hand-off: the embedded default, one orchestrator process.
    pub fn in_process(config: &WorkersConfig) -> Workers {
        Workers {
            shared: false,
            ..Workers::new(
                Arc::new(InProcessLeases::new()),
                Arc::new(InProcessHandoff::new(HANDOFF_WAIT)),
                config,
            )
        }
    }

    /// Leases and hand-off in the Redis at `config.redis_url`, shared with other
    /// processes; in-process ones when it is unset. Only a malformed URL fails here: a
    /// Redis that is down makes lease operations fail (and invocations wait) instead.
    pub fn from_config(config: &WorkersConfig) -> Result<Workers, LeaseError> {
        let Some(url) = &config.redis_url else {
            return Ok(Workers::in_process(config));
        };
        let leases = Arc::new(RedisLeases::new(RedisLeaseConfig::new(url.as_str()))?);
        let handoff = RedisHandoff::new(url, HANDOFF_KEY, HANDOFF_WAIT, REDIS_COMMAND_TIMEOUT)?;
        Ok(Workers::new(leases.clone(), Arc::new(handoff), config).with_places(leases))
    }

    /// These workers with the tenants' places kept in `places`, shared with the other
    /// processes: the tenants' bounds then hold across all of them.
    #[must_use]
    pub fn with_places(self, places: Arc<dyn TenantPlaces>) -> Workers {
        Workers {
            places: Some(places),
            ..self
        }
    }

    /// Workers over the given backends, shared with other processes (tests inject
    /// faulty ones).
    pub fn new(
        leases: Arc<dyn LeaseBackend>,
        handoff: Arc<dyn Handoff>,
        config: &WorkersConfig,
    ) -> Workers {
        Workers {
            leases,
            handoff,
            id: config
                .worker_id
                .clone()
                .unwrap_or_else(|| format!("orchestrator-{}", Uuid::new_v4())),
            ttl: Duration::from_millis(config.lease_ttl_ms),
            sweep_every: Duration::from_millis(config.sweep_every_ms),
            places: None,
            shared: true,
            keepers: Arc::new(OnceCell::new()),
        }
    }

    /// This worker's name, as its leases carry it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The keeper of this worker's leases. Started on first use, because it subscribes to
    /// revocations; a failed start is tried again at the next use.
    pub(crate) async fn keepers(&self) -> Result<&Keepers, LeaseError> {
        self.keepers
            .get_or_try_init(|| {
                Keepers::start(Arc::clone(&self.leases), KeeperConfig::for_ttl(self.ttl))
            })
            .await
    }
}
