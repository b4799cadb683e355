//! A bounded cache of parsed scripts, so a long invocation that sends the same
//! `scripted_model_json` every turn is parsed once.
//!
//! Bounds: at most [`MAX_ENTRIES`] scripts and [`MAX_CACHED_BYTES`] of script text in
//! total (a script is at most 4 MiB, so without the byte bound 256 entries could pin
//! 1 GiB). The least recently used entry goes first. Keys are SHA-256 digests of the
//! text, so the text itself is not kept. Only scripts that parse are cached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use agentloop_script::{ScriptError, ScriptedModel};

/// Most scripts kept.
pub const MAX_ENTRIES: usize = 256;
/// Most script text, summed over the entries, in bytes (64 MiB).
pub const MAX_CACHED_BYTES: usize = 64 * 1024 * 1024;

#[derive(Debug)]
struct Entry {
    model: Arc<ScriptedModel>,
    bytes: usize,
    last_used: u64,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<[u8; 32], Entry>,
    bytes: usize,
    clock: u64,
}

/// A bounded LRU cache of parsed scripts; cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct ScriptCache {
    inner: Mutex<Inner>,
}

impl ScriptCache {
    /// An empty cache.
    pub fn new() -> ScriptCache {
        ScriptCache::default()
    }

    /// The parsed script for `text`, parsing it on a miss.
    ///
    /// # Errors
    ///
    /// The [`ScriptError`] of [`ScriptedModel::parse`]; failures are not cached.
    pub fn get_or_parse(&self, text: &str) -> Result<Arc<ScriptedModel>, ScriptError> {
        let key: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        if let Some(model) = self.lookup(&key) {
            return Ok(model);
        }
        // Parse outside the lock: a 4 MiB script must not stall other requests.
        let model = Arc::new(ScriptedModel::parse(text)?);
        self.insert(key, Arc::clone(&model), text.len());
        Ok(model)
    }

    /// Number of cached scripts.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the map consistent (no partial
        // updates span an await or a fallible step), so a poisoned lock is usable.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lookup(&self, key: &[u8; 32]) -> Option<Arc<ScriptedModel>> {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        let entry = inner.entries.get_mut(key)?;
        entry.last_used = now;
        Some(Arc::clone(&entry.model))
    }

    fn insert(&self, key: [u8; 32], model: Arc<ScriptedModel>, bytes: usize) {
        if bytes > MAX_CACHED_BYTES {
            return;
        }
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        if let Some(old) = inner.entries.remove(&key) {
            inner.bytes -= old.bytes;
        }
        while !inner.entries.is_empty()
            && (inner.entries.len() >= MAX_ENTRIES || inner.bytes + bytes > MAX_CACHED_BYTES)
        {
            let oldest = inner
                .entries
                .iter()
                .min_by_key(|(_, entry)| entry.last_used)
                .map(|(key, _)| *key);
            let Some(oldest) = oldest else { break };
            if let Some(evicted) = inner.entries.remove(&oldest) {
                inner.bytes -= evicted.bytes;
            }
        }
        inner.bytes += bytes;
        inner.entries.insert(
            key,
            Entry {
                model,
                bytes,
                last_used: now,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(answer: usize) -> String {
        format!(r#"{{"turns":[{{"final":"{answer}"}}]}}"#)
    }

    #[test]
    fn hits_return_the_same_parse_and_the_bound_holds() {
        let cache = ScriptCache::new();
        let a = cache.get_or_parse(&script(0)).unwrap();
        let b = cache.get_or_parse(&script(0)).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        for i in 1..=MAX_ENTRIES + 10 {
            cache.get_or_parse(&script(i)).unwrap();
        }
        assert_eq!(cache.len(), MAX_ENTRIES);
        // The oldest went first; the newest is still there.
        let newest = cache.get_or_parse(&script(MAX_ENTRIES + 10)).unwrap();
        assert_eq!(cache.len(), MAX_ENTRIES);
        let again = cache.get_or_parse(&script(MAX_ENTRIES + 10)).unwrap();
        assert!(Arc::ptr_eq(&newest, &again));
    }

    #[test]
    fn recently_used_entries_survive_eviction() {
        let cache = ScriptCache::new();
        let first = cache.get_or_parse(&script(0)).unwrap();
        for i in 1..MAX_ENTRIES + 50 {
            // Keep touching the first script so it is never the least recent.
            let _ = cache.get_or_parse(&script(0)).unwrap();
            cache.get_or_parse(&script(i)).unwrap();
        }
        assert!(Arc::ptr_eq(
            &first,
            &cache.get_or_parse(&script(0)).unwrap()
        ));
    }

    #[test]
    fn scripts_that_differ_only_in_their_evidence_are_cached_apart() {
        let cache = ScriptCache::new();
        let cited = cache
            .get_or_parse(r#"{"turns":[{"final":"a","evidence":["l1"]}]}"#)
            .unwrap();
        let other = cache
            .get_or_parse(r#"{"turns":[{"final":"a","evidence":["l2"]}]}"#)
            .unwrap();
        assert!(!Arc::ptr_eq(&cited, &other));
        assert_ne!(cited.turns(), other.turns());
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn failures_are_not_cached() {
        let cache = ScriptCache::new();
        assert!(cache.get_or_parse("{").is_err());
        assert!(cache.is_empty());
    }
}
