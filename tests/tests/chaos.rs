//! The fault harness at the size CI affords: the local cluster with every process on a
//! host of its own, the manifests' NetworkPolicies enforced, one round of every fault on a
//! fresh seed (printed, so a failure can be run again with `agentloop chaos --seed`), and
//! the checker's verdict. Needs root, iproute2 and iptables; skips loudly without them
//! unless `AGENTLOOP_REQUIRE_NETNS=1`, as CI sets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use agentloop_e2e::bin_dir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_promise_holds_through_a_round_of_partitions_and_faults() {
    if !agentloop_chaos::runs_here("chaos") {
        return;
    }
    let seed = std::env::var("AGENTLOOP_CHAOS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("chaos: seed {seed} (AGENTLOOP_CHAOS_SEED={seed} repeats this schedule)");
    let lease = Duration::from_secs(1);
    let report = agentloop_chaos::run(&agentloop_chaos::Options {
        invocations: 300,
        seed,
        rounds: 1,
        lease,
        recovery_bound: Duration::from_secs(120),
        script: agentloop_bench::cluster::default_script(),
        bin_dir: bin_dir(),
    })
    .await
    .unwrap();
    let text = report.text();
    eprintln!("{text}");
    assert!(report.holds(), "seed {seed}:\n{text}");
    let verdict = &report.verdict;
    // The faults bit: leases were lost and taken over while writes were in flight.
    assert!(verdict.takeovers > 0, "no lease changed hands:\n{text}");
    assert_eq!(report.started, 300, "{text}");
    assert!(report.recovered_ms.is_some(), "{text}");
    // The NetworkPolicies were in force and stopped what they should.
    assert_eq!(report.network_policy.probes, 42, "{text}");
    assert!(report.network_policy.blocked > 0, "{text}");
}
