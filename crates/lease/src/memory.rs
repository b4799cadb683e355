//! The in-process backend: the embedded default, for one orchestrator process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::{
    Lease, LeaseBackend, LeaseError, REVOCATION_BUFFER, Revocations, unix_micros, validate,
};

/// Leases in a map behind a mutex, revocations on a `tokio::sync::broadcast` channel.
///
/// Expiry uses `tokio::time::Instant`, so tests may pause Tokio's clock. Epochs are
/// `max(last epoch + 1, microseconds since the Unix epoch)` from one counter for all keys:
/// strictly increasing per key (as required) *and* larger than any epoch a previous run of
/// the process handed out, because the event store remembers epochs across restarts and
/// would refuse a restarted process whose epochs began again at 1. That assumes the wall
/// clock does not step back across a restart by more than the restart took.
///
/// Expired entries are dropped when their key is next touched; the map holds at most one
/// entry per key ever leased and not released.
#[derive(Debug)]
pub struct InProcessLeases {
    state: Mutex<State>,
    revoked: broadcast::Sender<String>,
}

#[derive(Debug, Default)]
struct State {
    held: HashMap<String, Held>,
    last_epoch: u64,
    /// The owner of the last lease handed out, shared by the entries of the same owner
    /// (usually one worker takes many leases) instead of a copy in each.
    last_owner: Option<Arc<str>>,
}

#[derive(Debug)]
struct Held {
    owner: Arc<str>,
    epoch: u64,
    expires: Instant,
}

impl Held {
    fn is_live(&self, now: Instant) -> bool {
        now < self.expires
    }

    fn is(&self, lease: &Lease) -> bool {
        *self.owner == *lease.owner && self.epoch == lease.epoch
    }
}

impl Default for InProcessLeases {
    fn default() -> Self {
        Self::new()
    }
}

impl InProcessLeases {
    /// An empty lease table.
    pub fn new() -> Self {
        let (revoked, _) = broadcast::channel(REVOCATION_BUFFER);
        Self {
            state: Mutex::new(State::default()),
            revoked,
        }
    }

    /// The lock is never held across an await and no code under it panics, but a poisoned
    /// lock still holds consistent data (every mutation is a single insert or remove).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl LeaseBackend for InProcessLeases {
    async fn acquire(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, LeaseError> {
        validate(key, Some(owner), Some(ttl))?;
        let now = Instant::now();
        let mut state = self.lock();
        if state.held.get(key).is_some_and(|h| h.is_live(now)) {
            return Ok(None);
        }
        let epoch = state.last_epoch.saturating_add(1).max(unix_micros());
        state.last_epoch = epoch;
        let shared = match &state.last_owner {
            Some(last) if **last == *owner => Arc::clone(last),
            Some(_) | None => Arc::from(owner),
        };
        state.last_owner = Some(Arc::clone(&shared));
        state.held.insert(
            key.to_owned(),
            Held {
                owner: Arc::clone(&shared),
                epoch,
                expires: now + ttl,
            },
        );
        Ok(Some(Lease {
            key: key.to_owned(),
            owner: shared,
            epoch,
        }))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, LeaseError> {
        validate(&lease.key, Some(&*lease.owner), Some(ttl))?;
        let now = Instant::now();
        let mut state = self.lock();
        match state.held.get_mut(&lease.key) {
            Some(held) if held.is(lease) && held.is_live(now) => {
                held.expires = now + ttl;
                Ok(true)
            }
            Some(_) | None => Ok(false),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LeaseError> {
        validate(&lease.key, Some(&*lease.owner), None)?;
        let now = Instant::now();
        let mut state = self.lock();
        match state.held.get(&lease.key) {
            Some(held) if held.is(lease) && held.is_live(now) => {
                state.held.remove(&lease.key);
                Ok(true)
            }
            Some(_) | None => Ok(false),
        }
    }

    async fn revoke(&self, key: &str) -> Result<bool, LeaseError> {
        validate(key, None, None)?;
        let now = Instant::now();
        let removed = {
            let mut state = self.lock();
            state.held.remove(key).is_some_and(|h| h.is_live(now))
        };
        // No subscriber is not an error: nobody needed telling.
        let _ = self.revoked.send(key.to_owned());
        Ok(removed)
    }

    async fn subscribe_revocations(&self) -> Result<Revocations, LeaseError> {
        Ok(self.revoked.subscribe())
    }
}
