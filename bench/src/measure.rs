//! Measuring: latency histograms, and the process's CPU time and memory.

use std::time::Duration;

use crate::Percentiles;
use anyhow::Context;

/// Latencies in microseconds in log-linear buckets: exact below 64 µs, then 32 buckets
/// per power of two (at most 3% off), so its size is fixed whatever the sample count.
#[derive(Debug, Clone)]
pub(crate) struct Histogram {
    pub(crate) counts: Vec<u64>,
    pub(crate) total: u64,
}

pub(crate) const SUB_BITS: u32 = 5;
pub(crate) const LINEAR: u64 = 2 << SUB_BITS;
pub(crate) const BUCKETS: usize = LINEAR as usize + (64 - SUB_BITS as usize - 1) * (1 << SUB_BITS);

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
        }
    }
}

impl Histogram {
    pub(crate) fn bucket(value: u64) -> usize {
        if value < LINEAR {
            return value as usize;
        }
        let exponent = 63 - value.leading_zeros();
        let mantissa = (value >> (exponent - SUB_BITS)) - (1 << SUB_BITS);
        LINEAR as usize + ((exponent - SUB_BITS - 1) as usize) * (1 << SUB_BITS) + mantissa as usize
    }

    /// The smallest value of a bucket.
    pub(crate) fn lowest(bucket: usize) -> u64 {
        let bucket = bucket as u64;
        if bucket < LINEAR {
            return bucket;
        }
        let offset = bucket - LINEAR;
        let exponent = offset / (1 << SUB_BITS) + u64::from(SUB_BITS) + 1;
        let mantissa = offset % (1 << SUB_BITS) + (1 << SUB_BITS);
        mantissa << (exponent - u64::from(SUB_BITS))
    }

    pub(crate) fn record(&mut self, value: u64) {
        if let Some(count) = self.counts.get_mut(Histogram::bucket(value)) {
            *count += 1;
            self.total += 1;
        }
    }

    /// The value at quantile `q` (0..=1), in microseconds; 0 when empty.
    pub(crate) fn quantile(&self, q: f64) -> u64 {
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total.max(1));
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank && *count > 0 {
                return Histogram::lowest(bucket);
            }
        }
        0
    }

    pub(crate) fn percentiles(&self) -> Percentiles {
        Percentiles {
            p50: self.quantile(0.50) as f64 / 1000.0,
            p99: self.quantile(0.99) as f64 / 1000.0,
        }
    }
}

/// A `kB` line of `/proc/PID/status` (`pid` may be `self`), in bytes.
pub(crate) fn process_status(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    let kib: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// User + system CPU time of a process so far (`/proc/PID/stat`, `pid` may be `self`;
/// in USER_HZ = 100 ticks per second on Linux).
pub fn cpu_time(pid: &str) -> anyhow::Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("{path} has no command name"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |index: usize| -> anyhow::Result<u64> {
        let field = fields
            .get(index)
            .with_context(|| format!("{path} is too short"))?;
        Ok(field.parse()?)
    };
    // utime and stime are fields 14 and 15 of the line; 12 and 13 after the name.
    let ticks = tick(11)? + tick(12)?;
    Ok(Duration::from_millis(ticks * 10))
}
