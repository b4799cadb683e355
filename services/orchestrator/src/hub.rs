//! Live fan-out of committed events to watchers.
//!
//! Only events that are durable are published, after the store accepted them. A watcher
//! first subscribes, then replays the store, then follows the live channel; anything it
//! misses (a slow watcher lagging the bounded channel) it re-reads from the store, so a
//! watcher never skips an event and never sees one twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use agentloop_proto::v1 as pb;
use tokio::sync::broadcast;
use uuid::Uuid;

/// Events kept for slow watchers before they must catch up from the store.
const CHANNEL_CAPACITY: usize = 256;

/// The channels of the invocations this process runs. A channel is only made when the
/// first watcher subscribes: most invocations are never watched, and a parked one should
/// cost as little memory as possible.
#[derive(Debug, Default)]
pub(crate) struct Hub {
    channels: Mutex<HashMap<Uuid, Option<broadcast::Sender<Arc<pb::Event>>>>>,
}

impl Hub {
    /// Registers an invocation this process is about to run.
    pub(crate) fn open(&self, invocation_id: Uuid) {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels.entry(invocation_id).or_insert(None);
    }

    /// Unregisters it: watchers see the channel end and finish from the store.
    pub(crate) fn close(&self, invocation_id: Uuid) {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels.remove(&invocation_id);
    }

    /// Publishes committed events to the invocation's watchers, if it has any.
    pub(crate) fn publish(&self, invocation_id: Uuid, events: Vec<pb::Event>) {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(Some(sender)) = channels.get(&invocation_id) {
            for event in events {
                // No receiver is fine: every watcher left.
                let _ = sender.send(Arc::new(event));
            }
        }
    }

    /// A live subscription, if this process runs the invocation.
    pub(crate) fn subscribe(
        &self,
        invocation_id: Uuid,
    ) -> Option<broadcast::Receiver<Arc<pb::Event>>> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels.get_mut(&invocation_id).map(|channel| {
            channel
                .get_or_insert_with(|| broadcast::channel(CHANNEL_CAPACITY).0)
                .subscribe()
        })
    }
}
