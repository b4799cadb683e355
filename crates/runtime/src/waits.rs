//! Invocations that wait for a human: the replies that resume them and the ends that
//! close their wait (a cancel, the wait bound).
//!
//! Each is one event appended right after the waiting end, with that end's version as
//! the expected one and its lease epoch: whatever reaches the store first wins, and every
//! other writer finds the version moved (FAILED_PRECONDITION, nothing written). Nobody
//! holds the lease of a waiting invocation, so no runner competes; after a reply the
//! invocation runs again on this worker (or another, after a hand-off) under a new epoch,
//! like any adoption.

use agentloop_engine::{Event, EventBody, Reply, UnixMillis, WaitEnd};
use agentloop_store::{Append, InvocationRecord, InvocationState, StoreError};
use tracing::{debug, info, warn};

use crate::instruments::Resumed;
use crate::{Runtime, RuntimeError, Shared, workers};

/// How often the waiting invocations are counted for `agentloop_invocations_waiting`.
const COUNT_EVERY: std::time::Duration = std::time::Duration::from_secs(15);

/// The longest a reply waits for the run that committed the wait to finish here.
const RUN_EXIT_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

impl Runtime {
    /// Commits `reply` to the waiting invocation `record`, then runs it again. Nothing is
    /// written when it does not fit (FAILED_PRECONDITION), or when no worker could run it
    /// (RESOURCE_EXHAUSTED: this one is full and shares no hand-off queue).
    pub async fn reply(
        &self,
        record: &InvocationRecord,
        reply: Reply,
    ) -> Result<InvocationRecord, RuntimeError> {
        let shared = &self.shared;
        if shared.drain.is_cancelled() {
            return Err(RuntimeError::Unavailable(
                "the orchestrator is shutting down".into(),
            ));
        }
        let end = waiting_end(record)?;
        let id = record.invocation_id;
        self.until_the_waiting_run_is_gone(id).await;
        let now = shared.clock.now();
        let body = agentloop_engine::reply(end, reply, now)
            .map_err(|error| RuntimeError::FailedPrecondition(error.to_string()))?;
        let slot = shared.slot();
        if slot.is_none() && !shared.workers.shared {
            return Err(shared.full());
        }
        shared.append_after_wait(record, body, now).await?;
        info!(invocation = %id, "a human replied; the invocation runs again");
        match slot {
            Some(slot) => match self.adopt_in(id, slot, Resumed::Reply).await {
                Ok(adopted) => debug!(invocation = %id, ?adopted, "resumed after a reply"),
                // Committed and running: a sweep, a hand-off taker or the next start runs it.
                Err(error) => warn!(invocation = %id, %error, "replied, not resumed yet"),
            },
            None => self.hand_back(&id.to_string()).await,
        }
        Ok(shared.store.get(id).await?)
    }

    /// The run that committed the wait of `id` may still be finishing on this worker: it
    /// lets its lease and its slot go a moment after the commit. Until it is gone, an
    /// adoption would take it for a run of the invocation and start nothing, and its
    /// slot would count as taken; so a reply waits for it, a bounded while.
    async fn until_the_waiting_run_is_gone(&self, id: uuid::Uuid) {
        let shared = &self.shared;
        let gone = async {
            loop {
                let freed = shared.freed.notified();
                if !shared.runs(id) {
                    return;
                }
                freed.await;
            }
        };
        if tokio::time::timeout(RUN_EXIT_BOUND, gone).await.is_err() {
            warn!(invocation = %id, "the run that began the wait is still finishing; replying all the same");
        }
    }

    /// Ends every wait past its bound, a page at a time. Returns how many it ended.
    pub(crate) async fn expire_waits(&self) -> Result<usize, RuntimeError> {
        let mut ended = 0;
        loop {
            let now = self.shared.clock.now();
            let page = self
                .shared
                .store
                .expired_waits(now, workers::SWEEP_PAGE)
                .await?;
            let mut progress = false;
            for &id in &page {
                let record = self.shared.store.get(id).await?;
                if record.state != InvocationState::Waiting {
                    continue;
                }
                match self.shared.end_wait(&record, WaitEnd::Expired).await {
                    Ok(true) => {
                        info!(invocation = %id, "waited past its bound: deadline_exceeded");
                        ended += 1;
                        progress = true;
                    }
                    // Replied to, or ended by another orchestrator, in the meantime.
                    Ok(false) => progress = true,
                    Err(error) => warn!(invocation = %id, %error, "could not end a wait"),
                }
            }
            // A full page that changed something may have more behind it; a page whose
            // invocations all failed is left to the next sweep, so this loop is bounded.
            if page.len() < workers::SWEEP_PAGE as usize || !progress {
                return Ok(ended);
            }
        }
    }

    /// Counts the waiting invocations into `agentloop_invocations_waiting` now; every
    /// orchestrator also does so every 15 seconds.
    ///
    /// # Errors
    ///
    /// When the store fails; the gauge then keeps its last figures.
    pub async fn count_waiting(&self) -> Result<(), RuntimeError> {
        let counts = self.shared.store.count_waiting().await?;
        self.shared.instruments.waiting(&counts);
        Ok(())
    }

    /// Ends expired waits every `limits.wait_sweep_ms`, and counts the waiting
    /// invocations every [`COUNT_EVERY`], until shutdown. Every orchestrator runs it; two
    /// that race for one wait write it once (the version decides).
    pub(crate) async fn waits_loop(self) {
        let period = std::time::Duration::from_millis(self.shared.config.limits.wait_sweep_ms);
        let mut sweeps = tokio::time::interval(period);
        sweeps.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut counts = tokio::time::interval(COUNT_EVERY);
        counts.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.shared.drain.cancelled() => return,
                _ = sweeps.tick() => {
                    if let Err(error) = self.expire_waits().await {
                        warn!(%error, "the wait sweep failed");
                    }
                }
                _ = counts.tick() => {
                    if let Err(error) = self.count_waiting().await {
                        warn!(%error, "cannot count the waiting invocations");
                    }
                }
            }
        }
    }
}

impl Shared {
    /// Ends the wait of `record` for good: cancelled, or past its bound. `Ok(false)` when
    /// it no longer waits (a reply or another end came first).
    pub(crate) async fn end_wait(
        &self,
        record: &InvocationRecord,
        why: WaitEnd,
    ) -> Result<bool, RuntimeError> {
        let end = waiting_end(record)?;
        let now = self.clock.now();
        let body = agentloop_engine::end_wait(end, why, now)
            .map_err(|error| RuntimeError::FailedPrecondition(error.to_string()))?;
        match self.append_after_wait(record, body, now).await {
            Ok(()) => Ok(true),
            Err(RuntimeError::FailedPrecondition(_)) => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn append_after_wait(
        &self,
        record: &InvocationRecord,
        body: EventBody,
        now: UnixMillis,
    ) -> Result<(), RuntimeError> {
        let events = [Event {
            seq: record.version + 1,
            body,
        }];
        let append = Append {
            expected_version: record.version,
            lease_epoch: record.lease_epoch,
            events: &events,
            totals: record.totals,
            committed_at: now,
        };
        match self.store.append(record.invocation_id, append).await {
            Ok(()) => Ok(()),
            Err(
                StoreError::VersionConflict { .. }
                | StoreError::StaleEpoch { .. }
                | StoreError::Ended(_),
            ) => Err(RuntimeError::FailedPrecondition(
                "the invocation no longer waits: another reply, a cancel or the end of its \
                 wait came first"
                    .into(),
            )),
            Err(error) => Err(error.into()),
        }
    }
}

/// The end `record` waits after; FAILED_PRECONDITION when it does not wait.
fn waiting_end(record: &InvocationRecord) -> Result<&agentloop_engine::EndRecord, RuntimeError> {
    match (&record.state, &record.end) {
        (InvocationState::Waiting, Some(end)) if end.waits() => Ok(end),
        (state, _) => Err(RuntimeError::FailedPrecondition(format!(
            "invocation {} does not wait for a human: it is {}",
            record.invocation_id,
            match state {
                InvocationState::Running => "running",
                InvocationState::Waiting => "waiting without a pending end",
                InvocationState::Ended => "over",
            }
        ))),
    }
}
