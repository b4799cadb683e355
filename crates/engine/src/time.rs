//! Time as the engine sees it: a number the shell passes in, so tests control the clock.

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    /// This instant plus `millis`, saturating instead of wrapping.
    pub const fn saturating_add(self, millis: u64) -> UnixMillis {
        UnixMillis(self.0.saturating_add(millis))
    }
}

/// A source of the current time, injected into the I/O shell that drives the engine.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> UnixMillis;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> UnixMillis {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        UnixMillis(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
    }
}
