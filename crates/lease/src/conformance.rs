//! The behaviour every [`LeaseBackend`] must show, as a test suite backends run.
//!
//! Each check is a `pub async fn` taking a backend; keys are fresh UUIDs, so checks may
//! share one backend (and one Redis). [`run_all`] runs every check in [`CHECKS`] (with the
//! one runner of every suite, [`agentloop_testkit::conformance::run_checks`]) and names the
//! one that failed:
//!
//! ```no_run
//! # async fn example() {
//! use std::sync::Arc;
//! use agentloop_lease::{InProcessLeases, conformance};
//! conformance::run_all(|| async { (Arc::new(InProcessLeases::new()) as _, ()) }).await;
//! # }
//! ```
//!
//! Checks need a multi-threaded Tokio runtime (they race tasks) and real time (some wait
//! for a short TTL to pass — that wait is the behaviour under test).

// A test suite shipped for backends: a broken expectation is reported by panicking.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentloop_testkit::conformance::{Check, run_checks};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{KeeperConfig, KeeperExit, Keepers, Lease, LeaseBackend, LeaseError};

/// Every check, by name, in the order [`run_all`] runs them; each gets a backend.
pub const CHECKS: &[Check<Arc<dyn LeaseBackend>>] = &[
    ("acquire_release_round_trip", |b| {
        Box::pin(acquire_release_round_trip(b))
    }),
    ("invalid_arguments", |b| Box::pin(invalid_arguments(b))),
    ("epochs_strictly_increase", |b| {
        Box::pin(epochs_strictly_increase(b))
    }),
    ("exclusive_under_contention", |b| {
        Box::pin(exclusive_under_contention(b))
    }),
    ("renew_after_expiry_fails", |b| {
        Box::pin(renew_after_expiry_fails(b))
    }),
    ("non_owner_cannot_renew_or_release", |b| {
        Box::pin(non_owner_cannot_renew_or_release(b))
    }),
    ("takeover_after_expiry", |b| {
        Box::pin(takeover_after_expiry(b))
    }),
    ("revocation_reaches_subscribers", |b| {
        Box::pin(revocation_reaches_subscribers(b))
    }),
    ("keeper_renews_until_released", |b| {
        Box::pin(keeper_renews_until_released(b))
    }),
    ("keeper_fires_on_revocation", |b| {
        Box::pin(keeper_fires_on_revocation(b))
    }),
    ("keeper_fires_on_loss", |b| {
        Box::pin(keeper_fires_on_loss(b))
    }),
    ("renew_many_answers_each_lease", |b| {
        Box::pin(renew_many_answers_each_lease(b))
    }),
    ("one_keeper_keeps_many_leases_apart", |b| {
        Box::pin(one_keeper_keeps_many_leases_apart(b))
    }),
];

/// Runs every check in [`CHECKS`], each on a backend from `make`.
///
/// `make` returns the backend and a guard dropped after the check; a failing check
/// panics with its name.
pub async fn run_all<G>(make: impl AsyncFnMut() -> (Arc<dyn LeaseBackend>, G)) {
    // Nothing to await after a check: the backend is dropped with its last `Arc`.
    run_checks("lease", CHECKS, make, async |_| {}).await;
}

/// A key no other check uses.
pub fn fresh_key(what: &str) -> String {
    format!("{what}-{}", Uuid::new_v4())
}

const LONG: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_millis(40);
/// Bound on waiting for something that should happen promptly.
const PROMPTLY: Duration = Duration::from_secs(5);

async fn acquire(backend: &dyn LeaseBackend, key: &str, owner: &str, ttl: Duration) -> Lease {
    backend
        .acquire(key, owner, ttl)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{owner} could not acquire free key {key}"))
}

/// Polls `acquire` until it succeeds: the way to observe that a lease expired.
async fn acquire_when_free(backend: &dyn LeaseBackend, key: &str, owner: &str) -> Lease {
    let started = tokio::time::Instant::now();
    loop {
        if let Some(lease) = backend.acquire(key, owner, LONG).await.unwrap() {
            return lease;
        }
        assert!(started.elapsed() < PROMPTLY, "{key} never became free");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Acquire, refuse a second holder, release, release again fails, re-acquire.
pub async fn acquire_release_round_trip(backend: Arc<dyn LeaseBackend>) {
    let key = fresh_key("round-trip");
    let a = acquire(&*backend, &key, "worker-a", LONG).await;
    assert_eq!((a.key.as_str(), &*a.owner), (key.as_str(), "worker-a"));
    assert_eq!(backend.acquire(&key, "worker-b", LONG).await.unwrap(), None);
    assert_eq!(
        backend.acquire(&key, "worker-a", LONG).await.unwrap(),
        None,
        "even the holder cannot acquire twice"
    );
    assert!(backend.renew(&a, LONG).await.unwrap());
    assert!(backend.release(&a).await.unwrap());
    assert!(!backend.release(&a).await.unwrap(), "second release");
    assert!(
        !backend.renew(&a, LONG).await.unwrap(),
        "renew after release"
    );
    let b = acquire(&*backend, &key, "worker-b", LONG).await;
    assert!(b.epoch > a.epoch);
    assert!(backend.release(&b).await.unwrap());
}

/// Empty names and out-of-range TTLs are `InvalidArgument`.
pub async fn invalid_arguments(backend: Arc<dyn LeaseBackend>) {
    let key = fresh_key("invalid");
    let cases = [
        backend.acquire("", "w", LONG).await,
        backend.acquire(&key, "", LONG).await,
        backend.acquire(&key, "w", Duration::ZERO).await,
        backend.acquire(&key, "w", crate::MAX_TTL * 2).await,
        backend
            .acquire(&"k".repeat(crate::MAX_NAME_LEN + 1), "w", LONG)
            .await,
    ];
    for case in cases {
        assert!(
            matches!(case, Err(LeaseError::InvalidArgument(_))),
            "{case:?}"
        );
    }
    assert!(matches!(
        backend.revoke("").await,
        Err(LeaseError::InvalidArgument(_))
    ));
    // Nothing was taken by the refused calls.
    let lease = acquire(&*backend, &key, "w", LONG).await;
    assert!(matches!(
        backend.renew(&lease, Duration::ZERO).await,
        Err(LeaseError::InvalidArgument(_))
    ));
    assert!(backend.release(&lease).await.unwrap());
}

/// Epochs grow with every acquisition of a key, whoever acquires it and however the
/// previous lease ended (released, revoked, expired).
pub async fn epochs_strictly_increase(backend: Arc<dyn LeaseBackend>) {
    let key = fresh_key("epochs");
    let mut last = 0;
    for round in 0..12 {
        let owner = format!("worker-{}", round % 3);
        let ttl = if round % 4 == 3 { SHORT } else { LONG };
        let lease = if round % 4 == 0 {
            acquire_when_free(&*backend, &key, &owner).await
        } else {
            acquire(&*backend, &key, &owner, ttl).await
        };
        assert!(
            lease.epoch > last,
            "round {round}: {} after {last}",
            lease.epoch
        );
        last = lease.epoch;
        match round % 4 {
            0 | 1 => assert!(backend.release(&lease).await.unwrap()),
            2 => assert!(backend.revoke(&key).await.unwrap()),
            _ => {} // left to expire; the next round waits for it
        }
    }
}

/// 50 tasks race for one key, 20 attempts each: never two holders at once, and the epochs
/// in the order the leases were held strictly increase.
pub async fn exclusive_under_contention(backend: Arc<dyn LeaseBackend>) {
    let key = Arc::new(fresh_key("contention"));
    let holders = Arc::new(AtomicUsize::new(0));
    let epochs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..50 {
        let (backend, key, holders, epochs) = (
            Arc::clone(&backend),
            Arc::clone(&key),
            Arc::clone(&holders),
            Arc::clone(&epochs),
        );
        tasks.spawn(async move {
            let owner = format!("racer-{task}");
            let mut won = 0;
            for _ in 0..20 {
                let Some(lease) = backend.acquire(&key, &owner, LONG).await.unwrap() else {
                    tokio::task::yield_now().await;
                    continue;
                };
                let before = holders.fetch_add(1, Ordering::SeqCst);
                assert_eq!(before, 0, "{owner} acquired while another held the lease");
                epochs.lock().unwrap().push(lease.epoch);
                tokio::task::yield_now().await;
                holders.fetch_sub(1, Ordering::SeqCst);
                assert!(backend.release(&lease).await.unwrap(), "release by holder");
                won += 1;
            }
            won
        });
    }
    let mut total = 0;
    while let Some(won) = tasks.join_next().await {
        total += won.unwrap();
    }
    let epochs = epochs.lock().unwrap();
    assert!(total >= 2, "only {total} acquisitions in 1000 attempts");
    assert_eq!(epochs.len(), total);
    assert!(
        epochs.windows(2).all(|w| w[0] < w[1]),
        "epochs not strictly increasing in holding order"
    );
}

/// A lease whose TTL passed cannot be renewed, even if nobody took it.
pub async fn renew_after_expiry_fails(backend: Arc<dyn LeaseBackend>) {
    let key = fresh_key("renew-expired");
    let lease = acquire(&*backend, &key, "worker-a", SHORT).await;
    // Waiting for the TTL to pass is the behaviour under test.
    tokio::time::sleep(SHORT * 3).await;
    assert!(!backend.renew(&lease, LONG).await.unwrap());
    assert!(!backend.release(&lease).await.unwrap());
    let next = acquire(&*backend, &key, "worker-a", LONG).await;
    assert!(next.epoch > lease.epoch);
}

/// Renew and release need the exact owner and epoch.
pub async fn non_owner_cannot_renew_or_release(backend: Arc<dyn LeaseBackend>) {
    let key = fresh_key("non-owner");
    let lease = acquire(&*backend, &key, "worker-a", LONG).await;
    let forged = [
        Lease {
            owner: "worker-b".into(),
            ..lease.clone()
        },
        Lease {
            epoch: lease.epoch - 1,
            ..lease.clone()
        },
        Lease {
            epoch: lease.epoch + 1,
            ..lease.clone()
        },
        Lease {
            owner: format!("{}:{}", lease.owner, lease.epoch).into(),
            epoch: 0,
            key: key.clone(),
        },
    ];
    for forged in &forged {
        assert!(!backend.renew(forged, LONG).await.unwrap(), "{forged:?}");
        assert!(!backend.release(forged).await.unwrap(), "{forged:?}");
    }
    assert_eq!(backend.acquire(&key, "worker-b", LONG).await.unwrap(), None);
    assert!(backend.release(&lease).await.unwrap());
}

/// After the TTL another worker takes over; the old holder can neither renew nor release
/// the new lease.
pub async fn takeover_after_expiry(backend: Arc<dyn LeaseBackend>) {
    let key = fresh_key("takeover");
    let old = acquire(&*backend, &key, "worker-a", SHORT).await;
    let new = acquire_when_free(&*backend, &key, "worker-b").await;
    assert!(new.epoch > old.epoch);
    assert!(!backend.renew(&old, LONG).await.unwrap());
    assert!(!backend.release(&old).await.unwrap());
    assert!(backend.renew(&new, LONG).await.unwrap());
    assert!(backend.release(&new).await.unwrap());
}

/// A revocation deletes the lease and reaches every subscriber.
pub async fn revocation_reaches_subscribers(backend: Arc<dyn LeaseBackend>) {
    let key = fresh_key("revoke");
    let mut first = backend.subscribe_revocations().await.unwrap();
    let mut second = backend.subscribe_revocations().await.unwrap();
    let lease = acquire(&*backend, &key, "worker-a", LONG).await;
    assert!(backend.revoke(&key).await.unwrap());
    for subscriber in [&mut first, &mut second] {
        // Other checks may share the backend: skip their keys.
        let received = tokio::time::timeout(PROMPTLY, async {
            loop {
                let revoked = subscriber.recv().await.unwrap();
                if revoked == key {
                    return;
                }
            }
        })
        .await;
        assert!(received.is_ok(), "revocation of {key} not delivered");
    }
    assert!(
        !backend.renew(&lease, LONG).await.unwrap(),
        "revoked lease renewed"
    );
    assert!(
        !backend.revoke(&key).await.unwrap(),
        "nothing left to revoke"
    );
    let next = acquire(&*backend, &key, "worker-b", LONG).await;
    assert!(next.epoch > lease.epoch);
    assert!(backend.release(&next).await.unwrap());
}

/// A keeper keeps a short lease alive well past its TTL; release frees it.
pub async fn keeper_renews_until_released(backend: Arc<dyn LeaseBackend>) {
    let key = fresh_key("keeper-renews");
    let ttl = Duration::from_millis(300);
    let lease = acquire(&*backend, &key, "worker-a", ttl).await;
    let cancel = CancellationToken::new();
    let keepers = Keepers::start(Arc::clone(&backend), KeeperConfig::for_ttl(ttl))
        .await
        .unwrap();
    let keeper = keepers.keep(lease, cancel.clone());
    // Three TTLs pass: the behaviour under test is that the lease outlives them.
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(backend.acquire(&key, "worker-b", LONG).await.unwrap(), None);
    assert!(!cancel.is_cancelled());
    assert!(keeper.release().await.unwrap());
    assert!(
        !cancel.is_cancelled(),
        "a normal release must not cancel the work"
    );
    let next = acquire(&*backend, &key, "worker-b", LONG).await;
    assert!(backend.release(&next).await.unwrap());
}

/// A revocation fires the keeper's token long before any renewal would notice.
pub async fn keeper_fires_on_revocation(backend: Arc<dyn LeaseBackend>) {
    let key = fresh_key("keeper-revoked");
    let lease = acquire(&*backend, &key, "worker-a", LONG).await;
    let cancel = CancellationToken::new();
    let keepers = Keepers::start(Arc::clone(&backend), KeeperConfig::for_ttl(LONG))
        .await
        .unwrap();
    let keeper = keepers.keep(lease, cancel.clone());
    // A revocation of another key changes nothing.
    backend.revoke(&fresh_key("unrelated")).await.unwrap();
    assert!(backend.revoke(&key).await.unwrap());
    assert!(
        tokio::time::timeout(PROMPTLY, cancel.cancelled())
            .await
            .is_ok(),
        "token not fired within {PROMPTLY:?} of the revocation"
    );
    assert_eq!(keeper.stop(), KeeperExit::Revoked);
    assert!(keepers.is_empty(), "a stopped keeper leaves nothing behind");
}

/// When a renewal finds the lease gone, the token fires.
pub async fn keeper_fires_on_loss(backend: Arc<dyn LeaseBackend>) {
    let key = fresh_key("keeper-lost");
    let ttl = Duration::from_millis(300);
    let lease = acquire(&*backend, &key, "worker-a", ttl).await;
    let cancel = CancellationToken::new();
    let keepers = Keepers::start(Arc::clone(&backend), KeeperConfig::for_ttl(ttl))
        .await
        .unwrap();
    let keeper = keepers.keep(lease.clone(), cancel.clone());
    // Lose it without a revocation message: someone releases it behind the keeper's back.
    assert!(backend.release(&lease).await.unwrap());
    assert!(
        tokio::time::timeout(PROMPTLY, cancel.cancelled())
            .await
            .is_ok(),
        "token not fired after the lease was lost"
    );
    assert_eq!(keeper.stop(), KeeperExit::Lost);
}

/// `renew_many` answers for each lease, in order: extended when still held, `false` when
/// gone, and a gone one does not fail the others.
pub async fn renew_many_answers_each_lease(backend: Arc<dyn LeaseBackend>) {
    let mut leases = Vec::new();
    for index in 0..5 {
        let key = fresh_key(&format!("renew-many-{index}"));
        leases.push(Arc::new(acquire(&*backend, &key, "worker-a", LONG).await));
    }
    assert!(backend.release(&leases[1]).await.unwrap());
    assert!(backend.revoke(&leases[3].key).await.unwrap());
    let answers = backend.renew_many(&leases, LONG).await.unwrap();
    assert_eq!(answers, [true, false, true, false, true]);
    assert_eq!(
        backend.renew_many(&[], LONG).await.unwrap(),
        Vec::<bool>::new()
    );
    for index in [0, 2, 4] {
        assert!(backend.release(&leases[index]).await.unwrap());
    }
}

/// One keeper keeps many leases: it renews all of them past their TTL, and a revocation
/// or a loss fires only the work of that lease.
pub async fn one_keeper_keeps_many_leases_apart(backend: Arc<dyn LeaseBackend>) {
    let ttl = Duration::from_millis(300);
    let keepers = Keepers::start(Arc::clone(&backend), KeeperConfig::for_ttl(ttl))
        .await
        .unwrap();
    let mut kept = Vec::new();
    for index in 0..20 {
        let key = fresh_key(&format!("kept-{index}"));
        let lease = acquire(&*backend, &key, "worker-a", ttl).await;
        let cancel = CancellationToken::new();
        let keeper = keepers.keep(lease.clone(), cancel.clone());
        kept.push((lease, cancel, keeper));
    }
    assert_eq!(keepers.len(), 20);
    backend.revoke(&kept[3].0.key).await.unwrap();
    backend.release(&kept[7].0).await.unwrap();
    for index in [3, 7] {
        assert!(
            tokio::time::timeout(PROMPTLY, kept[index].1.cancelled())
                .await
                .is_ok(),
            "lease {index} gone but its work not cancelled"
        );
    }
    // Three TTLs pass: the behaviour under test is that the others outlive them.
    tokio::time::sleep(ttl * 3).await;
    for (index, (lease, cancel, _)) in kept.iter().enumerate() {
        if index == 3 || index == 7 {
            continue;
        }
        assert!(!cancel.is_cancelled(), "lease {index} fired");
        assert_eq!(
            backend.acquire(&lease.key, "worker-b", LONG).await.unwrap(),
            None,
            "lease {index} lapsed"
        );
    }
    let mut exits = Vec::new();
    for (index, (_, _, keeper)) in kept.into_iter().enumerate() {
        if index == 3 || index == 7 {
            exits.push(keeper.stop());
        } else {
            assert!(keeper.release().await.unwrap());
        }
    }
    assert_eq!(exits, [KeeperExit::Revoked, KeeperExit::Lost]);
    assert!(keepers.is_empty());
}

/// What every [`crate::Handoff`] must do, on a fresh, empty queue whose `take` waits a
/// short while (tens of milliseconds): oldest first, nothing lost or duplicated between
/// racing takers, an offer reaches a taker that is already waiting, bad keys refused.
pub async fn handoff_conforms(queue: Arc<dyn crate::Handoff>) {
    assert_eq!(
        queue.take().await.unwrap(),
        None,
        "an empty queue gives nothing"
    );
    for key in ["a", "b", "c"] {
        queue.offer(key).await.unwrap();
    }
    for key in ["a", "b", "c"] {
        assert_eq!(
            queue.take().await.unwrap().as_deref(),
            Some(key),
            "oldest first"
        );
    }
    assert!(matches!(
        queue.offer("").await,
        Err(LeaseError::InvalidArgument(_))
    ));

    // A taker that is waiting gets a key offered after it began; keep taking until it
    // comes, so the test does not depend on when the taker started waiting.
    let waiting = {
        let queue = queue.clone();
        tokio::spawn(async move {
            for _ in 0..1_000 {
                if let Some(key) = queue.take().await.unwrap() {
                    return key;
                }
            }
            panic!("the offered key never arrived");
        })
    };
    queue.offer("late").await.unwrap();
    assert_eq!(waiting.await.unwrap(), "late");

    // Racing takers share the keys: every key exactly once.
    let offered: Vec<String> = (0..200).map(|n| format!("k{n}")).collect();
    for key in &offered {
        queue.offer(key).await.unwrap();
    }
    let takers: Vec<_> = (0..8)
        .map(|_| {
            let queue = queue.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(key) = queue.take().await.unwrap() {
                    got.push(key);
                }
                got
            })
        })
        .collect();
    let mut taken = Vec::new();
    for taker in takers {
        taken.extend(taker.await.unwrap());
    }
    taken.sort();
    let mut expected = offered.clone();
    expected.sort();
    assert_eq!(taken, expected, "every key taken exactly once");
}

/// A full queue drops its oldest keys, never grows past [`crate::MAX_QUEUED`].
pub async fn handoff_is_bounded(queue: Arc<dyn crate::Handoff>) {
    for n in 0..crate::MAX_QUEUED + 5 {
        queue.offer(&format!("k{n}")).await.unwrap();
    }
    assert_eq!(queue.take().await.unwrap().as_deref(), Some("k5"));
    let mut left = 1;
    while queue.take().await.unwrap().is_some() {
        left += 1;
    }
    assert_eq!(left, crate::MAX_QUEUED);
}
