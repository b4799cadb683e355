//! The conformance suite against the in-process backend.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use agentloop_lease::{InProcessHandoff, InProcessLeases, LeaseBackend, conformance};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_process_backend_conforms() {
    conformance::run_all(|| async {
        (
            Arc::new(InProcessLeases::new()) as Arc<dyn LeaseBackend>,
            (),
        )
    })
    .await;
}

/// Under a paused Tokio clock expiry follows Tokio time exactly.
#[tokio::test(start_paused = true)]
async fn expiry_follows_tokio_time() {
    let backend = InProcessLeases::new();
    let ttl = std::time::Duration::from_secs(10);
    let lease = backend.acquire("k", "a", ttl).await.unwrap().unwrap();
    tokio::time::advance(ttl - std::time::Duration::from_millis(1)).await;
    assert_eq!(backend.acquire("k", "b", ttl).await.unwrap(), None);
    tokio::time::advance(std::time::Duration::from_millis(1)).await;
    let next = backend.acquire("k", "b", ttl).await.unwrap().unwrap();
    assert!(next.epoch > lease.epoch);
    assert!(!backend.renew(&lease, ttl).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_process_handoff_conforms() {
    let wait = std::time::Duration::from_millis(20);
    conformance::handoff_conforms(Arc::new(InProcessHandoff::new(wait))).await;
    conformance::handoff_is_bounded(Arc::new(InProcessHandoff::new(wait))).await;
}
