//! Keeps one lease alive and cancels its work the moment the lease is gone.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::{Lease, LeaseBackend, LeaseError, Revocations};

/// How a [`Keeper`] renews.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeeperConfig {
    /// The TTL each renewal asks for (normally the TTL the lease was acquired with).
    pub ttl: Duration,
    /// The pause between renewals; a third of the TTL leaves two more attempts before the
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

/// Why a [`Keeper`]'s task ended.
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
    /// The task ended abnormally (it panicked); the token was fired.
    Aborted,
}

/// Renews one lease in a background task until stopped, and fires `cancel` at once when
/// the lease is revoked, lost, or cannot be confirmed before it expires.
///
/// The task owns its stop token and this value keeps its join handle. Shutdown:
/// - [`Keeper::release`] at the end of the work: stop renewing, then release the lease so
///   the next worker need not wait out the TTL;
/// - [`Keeper::stop`] to stop renewing and keep the lease until its TTL (e.g. when the
///   process drains and another worker should take over later);
/// - dropping the keeper stops the task without waiting for it.
///
/// The fired token is the only signal the work gets; it must stop starting side effects
/// and stop committing (the store's fencing refuses its commits anyway once another worker
/// took over).
#[derive(Debug)]
pub struct Keeper {
    lease: Lease,
    backend: Arc<dyn LeaseBackend>,
    cancel: CancellationToken,
    stop: CancellationToken,
    _stop_on_drop: DropGuard,
    handle: JoinHandle<KeeperExit>,
}

impl Keeper {
    /// Starts keeping `lease` (just acquired with `config.ttl`); `cancel` is the work's
    /// token. Subscribes to revocations before returning, so a revocation made after this
    /// returns is never missed while the backend stays reachable.
    pub async fn start(
        backend: Arc<dyn LeaseBackend>,
        lease: Lease,
        config: KeeperConfig,
        cancel: CancellationToken,
    ) -> Result<Self, LeaseError> {
        let revocations = backend.subscribe_revocations().await?;
        let stop = CancellationToken::new();
        let handle = tokio::spawn(keep(
            Arc::clone(&backend),
            lease.clone(),
            config,
            revocations,
            cancel.clone(),
            stop.clone(),
        ));
        Ok(Self {
            lease,
            backend,
            cancel,
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
            handle,
        })
    }

    /// The lease being kept (its epoch is what commits must carry).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The work's token, fired when the lease is gone.
    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Stops renewing without releasing; returns why the task ended (`Stopped` unless
    /// the lease was already gone).
    pub async fn stop(self) -> KeeperExit {
        self.stop.cancel();
        match self.handle.await {
            Ok(exit) => exit,
            Err(_join_error) => {
                self.cancel.cancel();
                KeeperExit::Aborted
            }
        }
    }

    /// Stops renewing, then releases the lease. `Ok(false)`: it was no longer held.
    pub async fn release(self) -> Result<bool, LeaseError> {
        let backend = Arc::clone(&self.backend);
        let lease = self.lease.clone();
        self.stop().await;
        backend.release(&lease).await
    }
}

/// The keeper task. Every exit other than `stop` fires `cancel` before returning.
async fn keep(
    backend: Arc<dyn LeaseBackend>,
    lease: Lease,
    config: KeeperConfig,
    mut revocations: Revocations,
    cancel: CancellationToken,
    stop: CancellationToken,
) -> KeeperExit {
    // Conservative: the lease was acquired no later than now, so it expires no later than
    // now + ttl; each renewal moves the deadline to (time the request was sent) + ttl.
    let mut deadline = Instant::now() + config.ttl;
    let mut next_renewal = Instant::now() + config.renew_every;
    let mut revocations_open = true;
    let mut last_error: Option<LeaseError> = None;
    let exit = loop {
        let renew_now = tokio::select! {
            biased;
            () = stop.cancelled() => return KeeperExit::Stopped,
            revoked = revocations.recv(), if revocations_open => match revoked {
                Ok(key) if key == lease.key => break KeeperExit::Revoked,
                Ok(_other) => false,
                // Missed some keys: ours may be among them, so ask the backend now.
                Err(RecvError::Lagged(_)) => true,
                // The backend went away; renewals still tell us when the lease is gone.
                Err(RecvError::Closed) => {
                    revocations_open = false;
                    false
                }
            },
            () = tokio::time::sleep_until(deadline) => {
                break KeeperExit::Expired(last_error.take().unwrap_or(LeaseError::Timeout(config.ttl)));
            }
            () = tokio::time::sleep_until(next_renewal) => true,
        };
        if !renew_now {
            continue;
        }
        let sent = Instant::now();
        // Bounded by the deadline: a renewal still pending when the lease runs out is as
        // good as a failed one.
        let renewed = tokio::select! {
            biased;
            () = stop.cancelled() => return KeeperExit::Stopped,
            renewed = tokio::time::timeout_at(deadline, backend.renew(&lease, config.ttl)) => renewed,
        };
        match renewed {
            Ok(Ok(true)) => {
                deadline = sent + config.ttl;
                next_renewal = sent + config.renew_every;
                last_error = None;
            }
            Ok(Ok(false)) => break KeeperExit::Lost,
            Ok(Err(error)) => {
                tracing::warn!(key = %lease.key, %error, "lease renewal failed; retrying until the lease expires");
                // Retry sooner than a full period, but not in a busy loop.
                next_renewal =
                    Instant::now() + (config.renew_every / 4).max(Duration::from_millis(5));
                last_error = Some(error);
            }
            Err(_elapsed) => {
                break KeeperExit::Expired(
                    last_error.take().unwrap_or(LeaseError::Timeout(config.ttl)),
                );
            }
        }
    };
    cancel.cancel();
    tracing::info!(key = %lease.key, epoch = lease.epoch, ?exit, "lease gone; cancelled its work");
    exit
}
