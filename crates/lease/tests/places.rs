//! A tenant's places in Redis, shared by two backends as two orchestrator processes share
//! them: the bound holds across both, a place follows its lease, a freed place is free at
//! once, and the start rate is one bucket for the whole cluster. Against a real
//! `redis-server` the test starts.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::time::Duration;

use agentloop_lease::testing::RedisServer;
use agentloop_lease::{
    Admission, LeaseBackend, PlaceLimits, RedisLeaseConfig, RedisLeases, TenantPlaces,
};

fn backend(server: &RedisServer) -> RedisLeases {
    RedisLeases::new(RedisLeaseConfig::new(server.url())).unwrap()
}

const TTL: Duration = Duration::from_secs(30);

fn running(max_running: u32, reserve_for: Duration) -> PlaceLimits {
    PlaceLimits {
        max_running,
        starts_per_s: 0,
        start_burst: 0,
        reserve_for,
    }
}

#[tokio::test]
async fn the_bound_holds_across_workers_and_places_follow_their_leases() {
    let Some(server) = RedisServer::start_or_skip("places_bound").await else {
        return;
    };
    let (first, second) = (backend(&server), backend(&server));
    let limits = running(2, Duration::from_millis(200));
    // One place taken through each worker, each then leased as its runner would.
    assert_eq!(
        first.admit("acme", "a", &limits).await.unwrap(),
        Admission::Admitted
    );
    let a = first.acquire("a", "w1", TTL).await.unwrap().unwrap();
    assert_eq!(
        second.admit("acme", "b", &limits).await.unwrap(),
        Admission::Admitted
    );
    let b = second.acquire("b", "w2", TTL).await.unwrap().unwrap();
    // The bound is the tenant's across both; another tenant is not held back.
    for worker in [&first, &second] {
        assert_eq!(
            worker.admit("acme", "c", &limits).await.unwrap(),
            Admission::Full { limit: 2 }
        );
    }
    assert_eq!(
        second.admit("other", "x", &limits).await.unwrap(),
        Admission::Admitted
    );
    // Asking again for a place already held is not one more.
    assert_eq!(
        first.admit("acme", "a", &limits).await.unwrap(),
        Admission::Admitted
    );

    // A freed place is free at once, whoever frees it.
    second.free("acme", "a").await.unwrap();
    assert_eq!(
        first.admit("acme", "c", &limits).await.unwrap(),
        Admission::Admitted
    );
    let c = first.acquire("c", "w1", TTL).await.unwrap().unwrap();
    assert_eq!(
        first.admit("acme", "d", &limits).await.unwrap(),
        Admission::Full { limit: 2 }
    );

    // A place whose lease is gone (its worker lost it, or died) lapses once its
    // reservation has passed.
    assert!(second.release(&b).await.unwrap());
    let lapsed = async {
        loop {
            if first.admit("acme", "d", &limits).await.unwrap() == Admission::Admitted {
                return;
            }
            // The polling interval of a bounded wait for a 200 ms reservation to pass.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), lapsed)
        .await
        .expect("a place without a lease lapses");
    let d = first.acquire("d", "w1", TTL).await.unwrap().unwrap();
    assert_eq!(
        second.admit("acme", "e", &limits).await.unwrap(),
        Admission::Full { limit: 2 },
        "c and d, leased, keep their places past the reservation"
    );

    // A place held again (a takeover) counts, and is never refused, even at the bound.
    first.hold("acme", "g", &limits).await.unwrap();
    let g = first.acquire("g", "w1", TTL).await.unwrap().unwrap();
    for key in ["c", "d"] {
        first.free("acme", key).await.unwrap();
    }
    assert_eq!(
        first.admit("acme", "h", &limits).await.unwrap(),
        Admission::Admitted
    );
    assert_eq!(
        second.admit("acme", "i", &limits).await.unwrap(),
        Admission::Full { limit: 2 },
        "g (held) and h (admitted)"
    );
    for lease in [a, c, d, g] {
        assert!(first.release(&lease).await.unwrap());
    }
}

#[tokio::test]
async fn the_start_rate_is_one_bucket_for_the_whole_cluster() {
    let Some(server) = RedisServer::start_or_skip("places_rate").await else {
        return;
    };
    let (first, second) = (backend(&server), backend(&server));
    // A burst of three, then one a second: four starts in a few milliseconds.
    let limits = PlaceLimits {
        max_running: 0,
        starts_per_s: 1,
        start_burst: 3,
        reserve_for: TTL,
    };
    let mut verdicts = Vec::new();
    for (n, worker) in [&first, &second, &first, &second].into_iter().enumerate() {
        verdicts.push(
            worker
                .admit("acme", &format!("k{n}"), &limits)
                .await
                .unwrap(),
        );
    }
    assert_eq!(verdicts[..3], [Admission::Admitted; 3]);
    match verdicts[3] {
        Admission::TooFast { per_s: 1, retry_ms } => assert!(
            (1..=1_000).contains(&retry_ms),
            "a token within a second: {retry_ms} ms"
        ),
        other => panic!("the fourth start is too fast: {other:?}"),
    }
    // Another tenant has a bucket of its own.
    assert_eq!(
        second.admit("other", "k", &limits).await.unwrap(),
        Admission::Admitted
    );
}
