//! The floor under the distributed wiring: what one gRPC exchange costs over loopback
//! with the project's own server ([`agentloop_server::serve`]: tracing, the observe
//! layer, health) and client ([`agentloop_proto::client::connect`]), when the call
//! itself does nothing. The call is `grpc.health.v1.Health/Check`, served by every
//! process; client and server share this process, as the distributed wiring's do.
//!
//! Prints exchanges per second and CPU time (user + system, the whole process: both
//! ends and the kernel's loopback) per exchange.
//!
//! `cargo bench -p agentloop-bench --bench exchange -- [callers] [exchanges]`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a benchmark"
)]

use std::time::Instant;

use agentloop_bench::cpu_time;
use agentloop_proto::client::{ClientConfig, connect};
use agentloop_server::{ServiceSet, serve};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// The `agentloop` binary's allocator, under which the distributed wiring runs (the
/// service binaries keep glibc's; docs/performance.md gives the floor under both).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with('-'));
    let callers: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(100)
        .max(1);
    let exchanges: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, ServiceSet::new(), std::future::pending()));
        let transport = connect(&format!("http://{address}"), ClientConfig::default())
            .await
            .unwrap();
        let client = HealthClient::new(transport);
        let round = async |each: u64| {
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..callers {
                let mut client = client.clone();
                tasks.spawn(async move {
                    for _ in 0..each {
                        client.check(HealthCheckRequest::default()).await.unwrap();
                    }
                });
            }
            tasks.join_all().await;
        };
        // Warm: the connection's windows, the allocator's pages, the tasks' first polls.
        round(exchanges / callers / 10).await;
        let cpu = cpu_time("self").unwrap();
        let started = Instant::now();
        round(exchanges / callers).await;
        let elapsed = started.elapsed();
        let cpu = cpu_time("self").unwrap() - cpu;
        let done = (exchanges / callers * callers) as f64;
        println!(
            "{done} exchanges, {callers} callers at once: {:.0} exchanges/s, {:.1} µs CPU per exchange",
            done / elapsed.as_secs_f64(),
            cpu.as_secs_f64() * 1e6 / done,
        );
    });
}
