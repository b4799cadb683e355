//! The conformance suite, a Redis restart and the revocation latency, against a real
//! `redis-server` each test starts on a free loopback port.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use std::sync::Arc;
use std::time::Duration;

use agentloop_lease::testing::RedisServer;
use agentloop_lease::{
    Handoff, KeeperConfig, KeeperExit, Keepers, LeaseBackend, LeaseError, RedisHandoff,
    RedisLeaseConfig, RedisLeases, conformance,
};
use tokio_util::sync::CancellationToken;

fn backend(server: &RedisServer) -> Arc<RedisLeases> {
    Arc::new(RedisLeases::new(RedisLeaseConfig::new(server.url())).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_backend_conforms() {
    let Some(server) = RedisServer::start_or_skip("redis_backend_conforms").await else {
        return;
    };
    let url = server.url();
    conformance::run_all(|| {
        let url = url.clone();
        async move {
            let backend = RedisLeases::new(RedisLeaseConfig::new(url)).unwrap();
            (Arc::new(backend) as Arc<dyn LeaseBackend>, ())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_revocation_channel_is_the_documented_one() {
    let Some(server) = RedisServer::start_or_skip("revocation_channel").await else {
        return;
    };
    let client = redis::Client::open(server.url()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub
        .subscribe(agentloop_lease::REVOCATION_CHANNEL)
        .await
        .unwrap();
    let leases = backend(&server);
    leases.revoke("inv-1").await.unwrap();
    let mut messages = pubsub.on_message();
    let message = tokio::time::timeout(
        Duration::from_secs(5),
        futures::StreamExt::next(&mut messages),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(message.get_payload::<String>().unwrap(), "inv-1");
}

/// Kill Redis mid-run: calls fail with typed, retryable errors within their bound, a
/// keeper whose lease cannot be confirmed fires its token by the TTL, and everything works
/// again once Redis is back — with epochs still above the ones handed out before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_mid_run() {
    let Some(mut server) = RedisServer::start_or_skip("redis_restart_mid_run").await else {
        return;
    };
    let leases = backend(&server);
    let shared: Arc<dyn LeaseBackend> = leases.clone();
    let ttl = Duration::from_millis(600);
    let before = leases
        .acquire("inv", "worker-a", ttl)
        .await
        .unwrap()
        .unwrap();
    let cancel = CancellationToken::new();
    let keepers = Keepers::start(Arc::clone(&shared), KeeperConfig::for_ttl(ttl))
        .await
        .unwrap();
    let keeper = keepers.keep(before.clone(), cancel.clone());

    server.kill();
    let started = tokio::time::Instant::now();
    let error = leases.acquire("other", "worker-b", ttl).await.unwrap_err();
    assert!(
        matches!(error, LeaseError::Unavailable(_) | LeaseError::Timeout(_)),
        "{error:?}"
    );
    assert!(error.is_retryable());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "not bounded: {:?}",
        started.elapsed()
    );
    for result in [
        leases.renew(&before, ttl).await,
        leases.release(&before).await,
        leases.revoke("inv").await,
    ] {
        assert!(
            matches!(
                result,
                Err(LeaseError::Unavailable(_) | LeaseError::Timeout(_))
            ),
            "{result:?}"
        );
    }
    // The keeper cannot confirm its lease: it must give up by the TTL.
    assert!(
        tokio::time::timeout(ttl * 4, cancel.cancelled())
            .await
            .is_ok(),
        "keeper kept running on an unconfirmable lease"
    );
    assert!(matches!(keeper.stop(), KeeperExit::Expired(_)));

    server.restart().await;
    // The connection manager reconnects in the background; poll (bounded) until it has.
    let started = tokio::time::Instant::now();
    let after = loop {
        match leases.acquire("inv", "worker-b", ttl).await {
            Ok(Some(lease)) => break lease,
            Ok(None) => panic!("a restarted Redis without persistence is empty"),
            Err(error) => {
                assert!(error.is_retryable(), "{error:?}");
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "never recovered: {error:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(
        after.epoch > before.epoch,
        "epoch went back after Redis lost its data: {} <= {}",
        after.epoch,
        before.epoch
    );
    // Revocations flow again once the listener re-subscribed.
    let started = tokio::time::Instant::now();
    let mut revocations = loop {
        match leases.subscribe_revocations().await {
            Ok(receiver) => break receiver,
            Err(error) => {
                assert!(started.elapsed() < Duration::from_secs(10), "{error:?}");
            }
        }
    };
    assert!(leases.revoke("inv").await.unwrap());
    let revoked = tokio::time::timeout(Duration::from_secs(5), revocations.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(revoked, "inv");
    leases.shutdown().await;
}

/// Revocation -> keeper token fired, over 200 trials: every trial fires by the push path
/// (the revocation message), well before a renewal could have noticed. Prints p50/p99 (see
/// them with `--nocapture`).
///
/// The bounds are correctness bounds, not a speed benchmark: the lease lives 30 s and is
/// renewed every 10 s, so a broken revocation path would leave the token to the next
/// renewal (seconds) or to expiry. Measured on loopback: p50 0.2-0.3 ms, p99 0.5-1.1 ms;
/// `P99_BOUND` is 50 times that, room for a loaded, shared machine, and still two orders
/// of magnitude under the renewal period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_to_cancellation_latency() {
    /// The 99th percentile must stay under this.
    const P99_BOUND: Duration = Duration::from_millis(50);
    /// Each trial's token must fire within this: under the renewal period (`ttl / 3`), so
    /// a token fired by a renewal instead of the revocation fails the trial.
    const EACH_WITHIN: Duration = Duration::from_secs(5);
    let Some(server) = RedisServer::start_or_skip("revocation_latency").await else {
        return;
    };
    let leases = backend(&server);
    let shared: Arc<dyn LeaseBackend> = leases.clone();
    let ttl = Duration::from_secs(30);
    let config = KeeperConfig::for_ttl(ttl);
    assert!(EACH_WITHIN < config.renew_every);
    let trials = 200;
    let mut latencies = Vec::with_capacity(trials);
    let keepers = Keepers::start(Arc::clone(&shared), config).await.unwrap();
    for trial in 0..trials {
        let key = format!("latency-{trial}");
        let lease = leases.acquire(&key, "worker", ttl).await.unwrap().unwrap();
        let cancel = CancellationToken::new();
        let keeper = keepers.keep(lease, cancel.clone());
        let started = tokio::time::Instant::now();
        assert!(leases.revoke(&key).await.unwrap());
        tokio::time::timeout(EACH_WITHIN, cancel.cancelled())
            .await
            .unwrap_or_else(|_| panic!("trial {trial}: no cancellation within {EACH_WITHIN:?}"));
        latencies.push(started.elapsed());
        // Fired by the revocation, not by a lost renewal.
        assert_eq!(keeper.stop(), KeeperExit::Revoked, "trial {trial}");
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q).ceil() as usize).saturating_sub(1)];
    let (p50, p99) = (at(0.50), at(0.99));
    println!(
        "revocation -> keeper token fired, Redis on loopback, {trials} trials: p50 {p50:?}, p99 {p99:?}, max {:?}",
        latencies[latencies.len() - 1]
    );
    assert!(
        p99 < P99_BOUND,
        "revocation -> cancellation p99 {p99:?} is not under {P99_BOUND:?} (p50 {p50:?})"
    );
    leases.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_handoff_conforms() {
    let Some(server) = RedisServer::start_or_skip("redis_handoff_conforms").await else {
        return;
    };
    let queue = |key: &str| {
        Arc::new(
            RedisHandoff::new(
                &server.url(),
                key,
                Duration::from_millis(20),
                Duration::from_secs(1),
            )
            .unwrap(),
        )
    };
    conformance::handoff_conforms(queue("runnable-a")).await;
    conformance::handoff_is_bounded(queue("runnable-b")).await;
}

/// While Redis is down a hand-off fails with a retryable error within its bound, and works
/// again once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_handoff_survives_a_restart() {
    let Some(mut server) = RedisServer::start_or_skip("redis_handoff_restart").await else {
        return;
    };
    let queue = RedisHandoff::new(
        &server.url(),
        "runnable",
        Duration::from_millis(20),
        Duration::from_millis(500),
    )
    .unwrap();
    queue.offer("before").await.unwrap();
    server.kill();
    let error = queue.offer("during").await.unwrap_err();
    assert!(error.is_retryable(), "{error:?}");
    assert!(queue.take().await.unwrap_err().is_retryable());
    server.restart().await;
    // The restarted Redis keeps nothing; the queue works again (the sweep finds what the
    // restart lost).
    let mut offered = false;
    for _ in 0..100 {
        if queue.offer("after").await.is_ok() {
            offered = true;
            break;
        }
    }
    assert!(offered, "offers work again after the restart");
    let mut taken = None;
    for _ in 0..100 {
        if let Ok(Some(key)) = queue.take().await {
            taken = Some(key);
            break;
        }
    }
    assert_eq!(taken.as_deref(), Some("after"));
}
