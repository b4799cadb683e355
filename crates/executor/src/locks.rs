//! One async lock per (tool, effect key), so that concurrent requests with one key call
//! the tool one after the other: the second finds the first's entry in the record and
//! replays it. Writes with different keys do not wait for each other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OwnedMutexGuard;

type Key = (String, String);

/// A key's lock and how many requests hold or wait for it.
#[derive(Debug, Default)]
struct Slot {
    lock: Arc<tokio::sync::Mutex<()>>,
    users: usize,
}

/// The locks of the keys in use; a key's slot goes away with its last user, so the map
/// holds only the keys of in-flight writes.
#[derive(Debug, Default)]
pub(crate) struct KeyLocks {
    slots: Arc<Mutex<HashMap<Key, Slot>>>,
}

/// A held key lock. `'static`, so it can move into the blocking task that appends the
/// record: the lock is released only once the append is done, even if the request that
/// took it was dropped meanwhile.
#[derive(Debug)]
pub(crate) struct KeyGuard {
    // Field order is drop order: the lock is released before the slot may go away.
    _held: OwnedMutexGuard<()>,
    _user: User,
}

/// One registered user of a slot; dropping it unregisters (waiting or holding).
#[derive(Debug)]
struct User {
    slots: Arc<Mutex<HashMap<Key, Slot>>>,
    key: Key,
}

impl Drop for User {
    fn drop(&mut self) {
        // The map is valid after any panic (each change is one call), so poisoning is
        // ignored.
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = slots.get_mut(&self.key) {
            slot.users -= 1;
            if slot.users == 0 {
                slots.remove(&self.key);
            }
        }
    }
}

impl KeyLocks {
    /// Waits for the lock of (`tool`, `key`). Cancel-safe: dropping the future while it
    /// waits unregisters it.
    pub(crate) async fn lock(&self, tool: &str, key: &str) -> KeyGuard {
        let key = (tool.to_owned(), key.to_owned());
        let lock = {
            let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            let slot = slots.entry(key.clone()).or_default();
            slot.users += 1;
            Arc::clone(&slot.lock)
        };
        let user = User {
            slots: Arc::clone(&self.slots),
            key,
        };
        let held = lock.lock_owned().await;
        KeyGuard {
            _held: held,
            _user: user,
        }
    }

    /// Number of keys in use.
    #[cfg(test)]
    fn in_use(&self) -> usize {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[tokio::test]
    async fn one_key_is_held_once_and_slots_go_away_with_their_users() {
        let locks = KeyLocks::default();
        let first = locks.lock("t", "k").await;
        // Another key, or the same key of another tool, does not wait.
        let other = locks.lock("t", "k2").await;
        let other_tool = locks.lock("u", "k").await;
        assert_eq!(locks.in_use(), 3);
        {
            let waiting = locks.lock("t", "k");
            tokio::pin!(waiting);
            assert!(poll_once(waiting.as_mut()).await.is_none());
            // Dropped while waiting: still registered by `first` only.
        }
        drop(first);
        let again = locks.lock("t", "k").await;
        drop((again, other, other_tool));
        assert_eq!(locks.in_use(), 0);
    }

    /// Polls `future` once: `Some` if it was ready.
    async fn poll_once<F: std::future::Future + Unpin>(future: F) -> Option<F::Output> {
        let mut future = future;
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut future).poll(cx) {
                std::task::Poll::Ready(out) => Some(out),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}
