//! Keeps a worker's leases alive and cancels each one's work the moment its lease is gone.
//!
//! One [`Keepers`] per worker renews every lease the worker holds, in one batch per period
//! ([`LeaseBackend::renew_many`]: one round trip to Redis), and listens to one revocation
//! subscription for all of them. A lease it keeps costs an entry in a map, not a task, a
//! timer and a subscription of its own: a worker holding a hundred thousand waiting
//! invocations renews them with a few pipelined requests per period.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::{Lease, LeaseBackend, LeaseError, Revocations};

/// How a [`Keepers`] renews.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeeperConfig {
    /// The TTL each renewal asks for (normally the TTL the leases were acquired with).
    pub ttl: Duration,
    /// The pause between renewals; a third of the TTL leaves two more attempts before a
    /// lease can expire when one renewal fails.
    pub renew_every: Duration,
}

impl KeeperConfig {
    /// Renews every `ttl / 3`.
    pub fn for_ttl(ttl: Duration) -> Self {
        Self {
            ttl,
            renew_every: (ttl / 3).max(Duration::from_millis(1)),
        }
    }
}

/// Why a lease stopped being kept.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeeperExit {
    /// [`Keeper::stop`] or [`Keeper::release`] was called: the work ended normally and
    /// the cancellation token was *not* fired.
    Stopped,
    /// A revocation for the key arrived; the token was fired.
    Revoked,
    /// A renewal answered that the lease is no longer ours; the token was fired.
    Lost,
    /// No renewal succeeded before the lease's TTL ran out (backend unreachable); another
    /// worker may own it now, so the token was fired.
    Expired(LeaseError),
    /// The [`Keepers`] stopped (its worker shut down) while the lease was kept; the token
    /// was fired.
    Aborted,
}

/// A worker's lease keeper: renews every lease handed to [`Keepers::keep`] in one
/// background task until the last clone is dropped.
#[derive(Debug, Clone)]
pub struct Keepers {
    state: Arc<State>,
    _stop_on_drop: Arc<DropGuard>,
}

#[derive(Debug)]
struct State {
    backend: Arc<dyn LeaseBackend>,
    config: KeeperConfig,
    held: Mutex<HashMap<Key, Held>>,
    /// Fired when the task ends, so that a lease kept afterwards is not left unrenewed.
    stopped: CancellationToken,
}

/// A map key that is the lease's own key, not a copy of it: one string less for each of
/// the many leases a worker keeps.
#[derive(Debug)]
struct Key(Arc<Lease>);

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.key.hash(state);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for Key {}

impl std::borrow::Borrow<str> for Key {
    fn borrow(&self) -> &str {
        &self.0.key
    }
}

#[derive(Debug)]
struct Held {
    /// Shared with the renewal batch, which snapshots the set without copying it.
    lease: Arc<Lease>,
    cancel: CancellationToken,
    /// Conservative: the lease expires no later than this (the time the last renewal
    /// that succeeded was sent, plus the TTL).
    deadline: Instant,
    /// Set when the lease is gone (and `cancel` fired); the entry stays until its
    /// [`Keeper`] stops, so that it can tell why.
    exit: Option<KeeperExit>,
}

impl Keepers {
    /// Starts the worker's keeper. Subscribes to revocations before returning, so a
    /// revocation made after this returns is never missed while the backend stays
    /// reachable.
    ///
    /// # Errors
    ///
    /// The revocation subscription failed.
    pub async fn start(
        backend: Arc<dyn LeaseBackend>,
        config: KeeperConfig,
    ) -> Result<Self, LeaseError> {
        let revocations = backend.subscribe_revocations().await?;
        let stop = CancellationToken::new();
        let state = Arc::new(State {
            backend,
            config,
            held: Mutex::new(HashMap::new()),
            stopped: CancellationToken::new(),
        });
        tokio::spawn(keep(Arc::clone(&state), revocations, stop.clone()));
        Ok(Self {
            state,
            _stop_on_drop: Arc::new(stop.drop_guard()),
        })
    }

    /// Keeps `lease` (just acquired with the configured TTL) until the returned
    /// [`Keeper`] stops; `cancel` is its work's token, fired the moment the lease is gone.
    /// The token is the only signal the work gets: it must stop starting side effects and
    /// stop committing (the store's fencing refuses its commits anyway once another worker
    /// took over).
    pub fn keep(&self, lease: Lease, cancel: CancellationToken) -> Keeper {
        let exit = self
            .state
            .stopped
            .is_cancelled()
            .then_some(KeeperExit::Aborted);
        if exit.is_some() {
            cancel.cancel();
        }
        let lease = Arc::new(lease);
        let held = Held {
            lease: Arc::clone(&lease),
            cancel,
            deadline: Instant::now() + self.state.config.ttl,
            exit,
        };
        let mut all = self.state.lock();
        // Removed first: `insert` would keep the old key, and with it the old lease.
        all.remove(lease.key.as_str());
        all.insert(Key(Arc::clone(&lease)), held);
        drop(all);
        Keeper {
            lease,
            state: Arc::clone(&self.state),
        }
    }

    /// Leases being kept (gone ones included until their [`Keeper`] stops).
    pub fn len(&self) -> usize {
        self.state.lock().len()
    }

    /// Whether no lease is being kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One kept lease. Dropping it stops keeping the lease (without releasing it).
#[derive(Debug)]
pub struct Keeper {
    lease: Arc<Lease>,
    state: Arc<State>,
}

impl Keeper {
    /// The lease being kept (its epoch is what commits must carry).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Stops keeping the lease without releasing it; returns why keeping it ended
    /// (`Stopped` unless the lease was already gone).
    pub fn stop(self) -> KeeperExit {
        self.take().unwrap_or(KeeperExit::Stopped)
    }

    /// Stops keeping the lease, then releases it so the next worker need not wait out
    /// the TTL. `Ok(false)`: it was no longer held.
    ///
    /// # Errors
    ///
    /// The backend could not be reached.
    pub async fn release(self) -> Result<bool, LeaseError> {
        let state = Arc::clone(&self.state);
        let lease = Arc::clone(&self.lease);
        drop(self);
        state.backend.release(&lease).await
    }

    /// Removes this lease's entry; `Some(exit)` when the lease was already gone.
    fn take(&self) -> Option<KeeperExit> {
        let mut held = self.state.lock();
        match held.get(self.lease.key.as_str()) {
            Some(entry) if entry.lease.epoch == self.lease.epoch => held
                .remove(self.lease.key.as_str())
                .and_then(|entry| entry.exit),
            // Replaced by a newer lease on the same key, which this keeper must not stop.
            Some(_) | None => None,
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.take();
    }
}

impl State {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fires the work of `key`'s lease (any epoch) and records why.
    fn gone(&self, key: &str, exit: KeeperExit) {
        if let Some(held) = self.lock().get_mut(key) {
            end(held, exit);
        }
    }

    /// Renews every lease still kept, in one batch; returns when to renew next.
    async fn renew(&self, stop: &CancellationToken) -> Instant {
        let leases: Vec<Arc<Lease>> = self
            .lock()
            .values()
            .filter(|held| held.exit.is_none())
            .map(|held| Arc::clone(&held.lease))
            .collect();
        let config = self.config;
        let sent = Instant::now();
        if leases.is_empty() {
            return sent + config.renew_every;
        }
        // Bounded by the first deadline: a renewal still pending when a lease runs out is
        // as good as a failed one.
        let bound = self
            .earliest_deadline()
            .map_or(sent + config.ttl, |at| at.min(sent + config.ttl));
        let renewed = tokio::select! {
            biased;
            () = stop.cancelled() => return sent,
            renewed = tokio::time::timeout_at(bound, self.backend.renew_many(&leases, config.ttl)) => renewed,
        };
        let answers = match renewed {
            Ok(Ok(answers)) => answers,
            Ok(Err(error)) => return self.failed(error),
            Err(_elapsed) => return self.failed(LeaseError::Timeout(config.ttl)),
        };
        let mut held = self.lock();
        for (lease, still_ours) in leases.iter().zip(answers) {
            let Some(entry) = held.get_mut(lease.key.as_str()) else {
                continue;
            };
            if entry.lease.epoch != lease.epoch || entry.exit.is_some() {
                continue;
            }
            if still_ours {
                entry.deadline = sent + config.ttl;
            } else {
                end(entry, KeeperExit::Lost);
            }
        }
        sent + config.renew_every
    }

    /// A batch failed: leases whose deadline passed are expired; the rest are retried
    /// sooner than a full period, but not in a busy loop.
    fn failed(&self, error: LeaseError) -> Instant {
        tracing::warn!(%error, "lease renewal failed; retrying until the leases expire");
        self.expire(&error);
        Instant::now() + (self.config.renew_every / 4).max(Duration::from_millis(5))
    }

    /// Fires every kept lease whose deadline has passed.
    fn expire(&self, why: &LeaseError) {
        let now = Instant::now();
        for held in self.lock().values_mut() {
            if held.exit.is_none() && held.deadline <= now {
                end(held, KeeperExit::Expired(why.clone()));
            }
        }
    }

    /// The earliest deadline of a lease still kept.
    fn earliest_deadline(&self) -> Option<Instant> {
        self.lock()
            .values()
            .filter(|held| held.exit.is_none())
            .map(|held| held.deadline)
            .min()
    }
}

fn end(held: &mut Held, exit: KeeperExit) {
    if held.exit.is_none() {
        held.cancel.cancel();
        tracing::info!(key = %held.lease.key, epoch = held.lease.epoch, ?exit, "lease gone; cancelled its work");
        held.exit = Some(exit);
    }
}

/// The keeper task: renews every period, fires on revocations and expiries, until `stop`.
/// When it ends, every lease still kept is fired (`Aborted`): nobody renews them any more.
async fn keep(state: Arc<State>, mut revocations: Revocations, stop: CancellationToken) {
    let mut next_renewal = Instant::now() + state.config.renew_every;
    let mut revocations_open = true;
    loop {
        // Recomputed only here: a lease kept later expires later than every one kept now.
        let earliest = state.earliest_deadline();
        let renew_now = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            revoked = revocations.recv(), if revocations_open => match revoked {
                Ok(key) => {
                    state.gone(&key, KeeperExit::Revoked);
                    false
                }
                // Missed some keys: ours may be among them, so ask the backend now.
                Err(RecvError::Lagged(_)) => true,
                // The backend went away; renewals still tell us when a lease is gone.
                Err(RecvError::Closed) => {
                    revocations_open = false;
                    false
                }
            },
            () = sleep_until(earliest) => {
                state.expire(&LeaseError::Timeout(state.config.ttl));
                false
            }
            () = tokio::time::sleep_until(next_renewal) => true,
        };
        if renew_now {
            next_renewal = state.renew(&stop).await;
        }
    }
    state.stopped.cancel();
    for held in state.lock().values_mut() {
        end(held, KeeperExit::Aborted);
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
