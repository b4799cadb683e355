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

/// The nearest-rank percentile of sorted `values`: the smallest value with at least
/// `percent` of them at or below it (0 for none). Durations are reported this way by the
/// API's statistics and by evaluations, so the two agree on one run set.
pub fn nearest_rank(sorted: &[u64], percent: usize) -> u64 {
    let rank = (sorted.len() * percent).div_ceil(100).max(1);
    sorted
        .get(rank - 1)
        .or(sorted.last())
        .copied()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&values, 50), 50);
        assert_eq!(nearest_rank(&values, 95), 95);
        assert_eq!(nearest_rank(&values, 99), 99);
        assert_eq!(nearest_rank(&[7], 99), 7);
        assert_eq!(nearest_rank(&[1, 2, 3], 50), 2);
        assert_eq!(nearest_rank(&[1, 2, 3], 99), 3);
        assert_eq!(nearest_rank(&[], 50), 0);
    }
}
