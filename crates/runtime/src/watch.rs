//! Following an invocation's committed events, for watchers.
//!
//! A watcher sees every committed event once, in order, from where it asks, until the
//! invocation ends. While this process runs the invocation it subscribes to the live
//! events first (so nothing committed meanwhile is missed), reads from the store what was
//! committed before, then follows the live events. While another worker runs it, none
//! does yet, or it waits for a human, it reads the store every [`POLL`], less often while
//! nothing comes.

use std::sync::Arc;

use agentloop_engine::EventBody;
use agentloop_store::StoredEvent;
use tokio::sync::{broadcast, mpsc};
use uuid::Uuid;

use crate::{Runtime, RuntimeError, Shared};

/// Events read from the store per page while a watcher catches up.
const PAGE: u32 = 256;
/// Events buffered per watcher before it holds the runtime back.
const BUFFER: usize = 64;
/// How often a watcher reads the store while another worker runs the invocation, at
/// first; the pause doubles while nothing new is committed, up to [`POLL_MAX`] (an
/// invocation that waits for a human may wait for days).
const POLL: std::time::Duration = std::time::Duration::from_millis(200);
/// The longest pause between two reads of a watcher that polls.
const POLL_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// What a watcher receives: each committed event, or the error that ended the watch.
pub type Watched = Result<Arc<StoredEvent>, RuntimeError>;

impl Runtime {
    /// The committed events of `id` from `from` on, until the one that ends it (not a
    /// wait's end), the receiver going away, or a drain. The caller checked that the
    /// invocation exists and that `from` is at most one past its last event.
    pub fn watch(&self, id: Uuid, from: u64) -> mpsc::Receiver<Watched> {
        let (tx, rx) = mpsc::channel(BUFFER);
        // Tracked, so shutdown waits for it.
        self.shared
            .tracker
            .spawn(watch(self.shared.clone(), id, from, tx));
        rx
    }
}

/// Where a catch-up from the store left the watcher.
enum Caught {
    /// Everything committed so far was sent.
    Up,
    /// The final event was sent (or the watcher left): the watch is over.
    Over,
}

/// Whether `event` ends the invocation for good (a wait's end does not).
fn ends(event: &StoredEvent) -> bool {
    matches!(&event.event.body, EventBody::Ended(end) if !end.waits())
}

async fn watch(shared: Arc<Shared>, id: Uuid, mut next: u64, tx: mpsc::Sender<Watched>) {
    let mut pause = POLL;
    loop {
        let live = shared.hub.subscribe(id);
        // Only the store has what was committed before the subscription (for a watcher of
        // an invocation that just started here: nothing, so no read).
        let stored = live.as_ref().is_none_or(|live| next <= live.published);
        let before = next;
        if stored && let Caught::Over = catch_up(&shared, id, &mut next, &tx).await {
            return;
        }
        if next != before {
            pause = POLL;
        }
        let caught = match live {
            Some(live) => {
                pause = POLL;
                follow(&shared, id, &mut next, &tx, live.events).await
            }
            None => tokio::select! {
                () = shared.drain.cancelled() => Caught::Over,
                () = tx.closed() => Caught::Over,
                () = tokio::time::sleep(pause) => {
                    pause = (pause * 2).min(POLL_MAX);
                    Caught::Up
                }
            },
        };
        if let Caught::Over = caught {
            return;
        }
    }
}

/// Follows the live channel of an invocation this process runs, until it ends or the
/// channel closes (the runner stopped here: `Up`, and the caller looks again).
async fn follow(
    shared: &Shared,
    id: Uuid,
    next: &mut u64,
    tx: &mpsc::Sender<Watched>,
    mut live: broadcast::Receiver<Arc<StoredEvent>>,
) -> Caught {
    loop {
        let caught = match live.recv().await {
            Ok(event) if event.event.seq < *next => Caught::Up,
            Ok(event) if event.event.seq == *next => {
                *next += 1;
                let over = ends(&event);
                if tx.send(Ok(event)).await.is_err() || over {
                    Caught::Over
                } else {
                    Caught::Up
                }
            }
            // A gap (this watcher lagged): the store has what it missed.
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                catch_up(shared, id, next, tx).await
            }
            Err(broadcast::error::RecvError::Closed) => return Caught::Up,
        };
        if let Caught::Over = caught {
            return Caught::Over;
        }
    }
}

async fn catch_up(shared: &Shared, id: Uuid, next: &mut u64, tx: &mpsc::Sender<Watched>) -> Caught {
    loop {
        let page = match shared.store.events(id, *next, PAGE).await {
            Ok(page) => page,
            Err(error) => {
                let _ = tx.send(Err(error.into())).await;
                return Caught::Over;
            }
        };
        let full = page.len() == PAGE as usize;
        for stored in page {
            *next = stored.event.seq + 1;
            let over = ends(&stored);
            if tx.send(Ok(Arc::new(stored))).await.is_err() || over {
                return Caught::Over;
            }
        }
        if !full {
            return Caught::Up;
        }
    }
}
