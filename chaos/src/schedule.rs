//! The schedule of faults: every kind once per round, in an order and on orchestrators a
//! seed picks, each held for 2.5 to 4 leases with 1 to 2 leases of calm after it; a
//! flapping link goes down five times, and the orchestrators are paused four times, each a
//! little past the lease. The same seed gives the same schedule.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::fault::{Fault, HARNESS};

/// The hosts of the cluster, as the harness names them.
pub const ORCHESTRATORS: [&str; 2] = ["orchestrator-0", "orchestrator-1"];
/// The other hosts.
pub const SERVICES: [&str; 7] = [
    "decision",
    "policy",
    "tools",
    "ledger",
    "demo-executor",
    "postgres",
    "redis",
];

/// How many times a flapping link goes down.
const FLAPS: u32 = 5;
/// How many pauses a round holds: each is a chance for a worker to wake past its lease
/// with a commit already on its way, which only fencing stops.
const PAUSES: u32 = 4;

/// One fault of the schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    /// When it starts, from the start of the run.
    pub at_ms: u64,
    /// How long it holds.
    pub hold_ms: u64,
    /// What it is.
    pub fault: Fault,
}

/// The kinds of fault, one of each per round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    FromRedis,
    FromPostgres,
    FromTools,
    FromLedger,
    FromEverything,
    OneWay,
    Flapping,
    SlowPostgres,
    Delay,
    Reordering,
    Loss,
    Duplication,
    Pause,
}

const KINDS: [Kind; 13] = [
    Kind::FromRedis,
    Kind::FromPostgres,
    Kind::FromTools,
    Kind::FromLedger,
    Kind::FromEverything,
    Kind::OneWay,
    Kind::Flapping,
    Kind::SlowPostgres,
    Kind::Delay,
    Kind::Reordering,
    Kind::Loss,
    Kind::Duplication,
    Kind::Pause,
];

/// Everything an orchestrator talks to, the callers included.
fn everything() -> Vec<String> {
    let mut peers: Vec<String> = SERVICES.iter().map(|s| (*s).to_owned()).collect();
    peers.push(HARNESS.to_owned());
    peers
}

fn peers(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

/// `rounds` rounds of every kind of fault, for a lease of `lease`, from `seed`.
pub fn schedule(seed: u64, rounds: u32, lease: Duration) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
    let mut steps = Vec::new();
    // A lease of calm before the first fault: every process has settled.
    let mut at = lease_ms;
    for _ in 0..rounds {
        let mut kinds = KINDS;
        kinds.shuffle(&mut rng);
        for kind in kinds {
            let host = ORCHESTRATORS[rng.random_range(0..ORCHESTRATORS.len())].to_owned();
            let hold = rng.random_range(lease_ms * 5 / 2..=lease_ms * 4);
            let fault = match kind {
                Kind::FromRedis => Fault::Partition {
                    host,
                    peers: peers(&["redis"]),
                },
                Kind::FromPostgres => Fault::Partition {
                    host,
                    peers: peers(&["postgres"]),
                },
                Kind::FromTools => Fault::Partition {
                    host,
                    peers: peers(&["tools", "demo-executor"]),
                },
                Kind::FromLedger => Fault::Partition {
                    host,
                    peers: peers(&["ledger"]),
                },
                Kind::FromEverything => Fault::Partition {
                    host,
                    peers: everything(),
                },
                Kind::OneWay => Fault::OneWay {
                    host,
                    peers: everything(),
                },
                Kind::Flapping => {
                    // Down and up again, FLAPS times, each for a few tenths of a lease.
                    for _ in 0..FLAPS {
                        let down = rng.random_range(lease_ms / 4..=lease_ms * 3 / 4);
                        steps.push(Step {
                            at_ms: at,
                            hold_ms: down,
                            fault: Fault::Partition {
                                host: host.clone(),
                                peers: everything(),
                            },
                        });
                        at += down + rng.random_range(lease_ms / 4..=lease_ms * 3 / 4);
                    }
                    at += rng.random_range(lease_ms..=lease_ms * 2);
                    continue;
                }
                // Every answer of PostgreSQL 200 ms late.
                Kind::SlowPostgres => Fault::Delay {
                    host: "postgres".to_owned(),
                    peers: peers(&[ORCHESTRATORS[0], ORCHESTRATORS[1], "ledger", HARNESS]),
                    delay_ms: 200,
                    jitter_ms: 0,
                },
                Kind::Delay => Fault::Delay {
                    host,
                    peers: everything(),
                    delay_ms: 100,
                    jitter_ms: 0,
                },
                // Each packet 5 to 45 ms late: many overtake the one before.
                Kind::Reordering => Fault::Delay {
                    host,
                    peers: everything(),
                    delay_ms: 5,
                    jitter_ms: 40,
                },
                Kind::Loss => Fault::Loss {
                    host,
                    peers: everything(),
                    percent: 30,
                },
                Kind::Duplication => Fault::Duplicate {
                    host,
                    peers: everything(),
                },
                Kind::Pause => {
                    // Each orchestrator in turn, each time a little past the lease.
                    for n in 0..PAUSES {
                        let hold = rng.random_range(lease_ms * 3 / 2..=lease_ms * 3);
                        steps.push(Step {
                            at_ms: at,
                            hold_ms: hold,
                            fault: Fault::Pause {
                                host: ORCHESTRATORS[n as usize % ORCHESTRATORS.len()].to_owned(),
                            },
                        });
                        at += hold + rng.random_range(lease_ms..=lease_ms * 2);
                    }
                    continue;
                }
            };
            steps.push(Step {
                at_ms: at,
                hold_ms: hold,
                fault,
            });
            at += hold + rng.random_range(lease_ms..=lease_ms * 2);
        }
    }
    steps
}

/// When the last fault of `steps` has healed, from the start of the run.
pub fn healed_at(steps: &[Step]) -> Duration {
    Duration::from_millis(
        steps
            .iter()
            .map(|step| step.at_ms + step.hold_ms)
            .max()
            .unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule_and_every_kind_once_per_round() {
        let lease = Duration::from_secs(1);
        let one = schedule(7, 2, lease);
        assert_eq!(one, schedule(7, 2, lease));
        assert_ne!(one, schedule(8, 2, lease));
        // Every kind is one step, but flapping (FLAPS steps) and pausing (PAUSES).
        assert_eq!(one.len(), 2 * (KINDS.len() - 2 + (FLAPS + PAUSES) as usize));
        let paused = one
            .iter()
            .filter(|s| matches!(s.fault, Fault::Pause { .. }))
            .count();
        assert_eq!(paused, 2 * PAUSES as usize);
        // One fault at a time: each starts after the one before has healed.
        for pair in one.windows(2) {
            assert!(pair[1].at_ms >= pair[0].at_ms + pair[0].hold_ms, "{pair:?}");
        }
        // Partitions and pauses outlast the lease, so leases are lost and taken over.
        for step in &one {
            if matches!(step.fault, Fault::Pause { .. }) {
                assert!((1_500..=3_000).contains(&step.hold_ms), "{step:?}");
            }
        }
        assert_eq!(
            healed_at(&one),
            Duration::from_millis(one.last().map_or(0, |s| s.at_ms + s.hold_ms))
        );
    }
}
