//! Live fan-out of committed events to watchers.
//!
//! Only events that are durable are published, after the store accepted them. A watcher
//! first subscribes, then replays from the store what was published before it subscribed
//! (the hub knows up to which sequence number: none, for an invocation that just
//! started), then follows the live channel; anything it misses (a slow watcher lagging
//! the bounded channel) it re-reads from the store, so a watcher never skips an event and
//! never sees one twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use agentloop_store::StoredEvent;
use tokio::sync::broadcast;
use uuid::Uuid;

/// Events kept for slow watchers before they must catch up from the store. A turn
/// publishes one or two, so this is many turns of slack. Every slot is allocated with the
/// channel, which every watched running invocation has: 256 slots raised the peak
/// resident set at N = 1,000 by about 4 MiB in `agentloop bench`.
const CHANNEL_CAPACITY: usize = 32;

/// The channels of the invocations this process runs. A channel is only made when the
/// first watcher subscribes: most invocations are never watched, and a parked one should
/// cost as little memory as possible.
#[derive(Debug, Default)]
pub(crate) struct Hub {
    channels: Mutex<HashMap<Uuid, Channel>>,
}

#[derive(Debug)]
struct Channel {
    sender: Option<broadcast::Sender<Arc<StoredEvent>>>,
    /// The last sequence number committed: the store holds every event up to it.
    published: u64,
}

/// A subscription to an invocation's live events.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) events: broadcast::Receiver<Arc<StoredEvent>>,
    /// Every event up to this sequence number was committed before the subscription, so
    /// only the store has it; every later one comes on `events`.
    pub(crate) published: u64,
}

impl Hub {
    /// Registers an invocation this process is about to run, whose log holds `committed`
    /// events.
    pub(crate) fn open(&self, invocation_id: Uuid, committed: u64) {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels.entry(invocation_id).or_insert(Channel {
            sender: None,
            published: committed,
        });
    }

    /// Unregisters it: watchers see the channel end and finish from the store.
    pub(crate) fn close(&self, invocation_id: Uuid) {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels.remove(&invocation_id);
    }

    /// Publishes committed events to the invocation's watchers, if it has any: each is
    /// the `Arc` the runner's window holds, so none is copied.
    pub(crate) fn publish(&self, invocation_id: Uuid, events: &[Arc<StoredEvent>]) {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(channel) = channels.get_mut(&invocation_id) else {
            return;
        };
        if let Some(last) = events.last() {
            channel.published = channel.published.max(last.event.seq);
        }
        if let Some(sender) = &channel.sender {
            for event in events {
                // No receiver is fine: every watcher left.
                let _ = sender.send(Arc::clone(event));
            }
        }
    }

    /// A live subscription, if this process runs the invocation.
    pub(crate) fn subscribe(&self, invocation_id: Uuid) -> Option<Live> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels.get_mut(&invocation_id).map(|channel| Live {
            events: channel
                .sender
                .get_or_insert_with(|| broadcast::channel(CHANNEL_CAPACITY).0)
                .subscribe(),
            published: channel.published,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64) -> Arc<StoredEvent> {
        Arc::new(StoredEvent {
            committed_at: agentloop_engine::UnixMillis(seq),
            event: agentloop_engine::Event {
                seq,
                body: agentloop_engine::EventBody::ClarificationAnswered(
                    agentloop_engine::Answer {
                        answer: "yes".into(),
                        actor: "ana".into(),
                        waited_ms: 1,
                        action: None,
                    },
                ),
            },
        })
    }

    /// A subscriber learns up to which sequence number only the store has the events, and
    /// receives every later one live, as the very event the runner published.
    #[tokio::test]
    async fn a_subscription_says_what_only_the_store_has() {
        let hub = Hub::default();
        let id = Uuid::now_v7();
        assert!(hub.subscribe(id).is_none(), "not run here");
        // Resumed with 5 events in the log: a watcher from seq 1 must read the store.
        hub.open(id, 5);
        hub.publish(id, &[event(6)]);
        let mut live = hub.subscribe(id).expect("runs here");
        assert_eq!(live.published, 6);
        let seventh = event(7);
        hub.publish(id, &[Arc::clone(&seventh), event(8)]);
        let received = live.events.recv().await.expect("live");
        assert!(Arc::ptr_eq(&received, &seventh), "shared, not copied");
        assert_eq!(live.events.recv().await.expect("live").event.seq, 8);
        assert_eq!(hub.subscribe(id).expect("runs here").published, 8);
        hub.close(id);
        assert!(hub.subscribe(id).is_none());
    }
}
