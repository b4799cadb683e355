//! Sharing equal immutable values among invocations.
//!
//! Most invocations of a deployment call the same few sets of tools; a parked invocation
//! should not pay for its own copy of what thousands of others hold too.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use crate::ports::Tool;

/// A bounded set of shared values: [`Interner::intern`] hands out the held copy of an
/// equal value, and holds new ones until it holds `max`. Values are never evicted (they
/// are small and few), so past `max` a new value is simply not shared.
#[derive(Debug)]
pub(crate) struct Interner<T> {
    held: Mutex<HashSet<Arc<T>>>,
    max: usize,
}

impl<T: Hash + Eq> Interner<T> {
    pub(crate) fn new(max: usize) -> Interner<T> {
        Interner {
            held: Mutex::new(HashSet::new()),
            max,
        }
    }

    /// The held value equal to `value`, or `value` itself, held if there is room.
    pub(crate) fn intern(&self, value: T) -> Arc<T> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = held.get(&value) {
            return Arc::clone(found);
        }
        let value = Arc::new(value);
        if held.len() < self.max {
            held.insert(Arc::clone(&value));
        }
        value
    }
}

/// The tools an invocation may call, as shown to the model: an [`Interner`] value
/// hashed by the tools' names alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Descriptors(pub(crate) Vec<Tool>);

impl Hash for Descriptors {
    // By name alone: equal lists have equal names, and a deployment rarely has two
    // lists of the same names.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        for descriptor in &self.0 {
            descriptor.name.hash(state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy_until_the_bound() {
        let interner = Interner::new(2);
        let a = interner.intern("a".to_owned());
        assert!(Arc::ptr_eq(&a, &interner.intern("a".to_owned())));
        let b = interner.intern("b".to_owned());
        assert!(!Arc::ptr_eq(&a, &b));
        // Full: a third value is handed out, not held, so it is not shared.
        let c = interner.intern("c".to_owned());
        assert_eq!(*c, "c");
        assert!(!Arc::ptr_eq(&c, &interner.intern("c".to_owned())));
        // The held ones still are.
        assert!(Arc::ptr_eq(&b, &interner.intern("b".to_owned())));
    }

    /// Descriptor lists hash by name but are shared only when equal in every field.
    #[test]
    fn descriptor_lists_are_shared_only_when_equal() {
        let lookup = |description: &str| {
            Descriptors(vec![Tool {
                name: "lookup".into(),
                description: description.into(),
                input_schema_json: "{}".into(),
                side_effect: agentloop_engine::SideEffect::ReadOnly,
                commutative: false,
                timeout_ms: None,
                requires_approval: false,
                digest: None,
                unavailable: false,
            }])
        };
        let interner = Interner::new(8);
        let first = interner.intern(lookup("Looks a key up"));
        assert!(Arc::ptr_eq(
            &first,
            &interner.intern(lookup("Looks a key up"))
        ));
        let changed = interner.intern(lookup("Looks a key up, faster"));
        assert!(!Arc::ptr_eq(&first, &changed));
        assert_eq!(changed.0[0].description, "Looks a key up, faster");
    }
}
