//! `agentloop health` against a real `agentloop dev` and against a port nobody serves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agentloop, dev, stderr, stdout};

#[test]
fn health_exits_0_for_a_serving_process_and_1_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, endpoint) = dev(dir.path(), &[]);
    let health = |args: &[&str]| {
        agentloop(dir.path())
            .args(["health", "--server", &endpoint])
            .args(args)
            .output()
            .unwrap()
    };

    let overall = health(&[]);
    assert_eq!(overall.status.code(), Some(0), "{}", stderr(&overall));
    assert_eq!(stdout(&overall).trim(), "SERVING");
    let orchestrator = health(&["--service", "agentloop.v1.OrchestratorService"]);
    assert_eq!(
        orchestrator.status.code(),
        Some(0),
        "{}",
        stderr(&orchestrator)
    );
    // A service the process does not serve: the health service says NOT_FOUND.
    let unknown = health(&["--service", "agentloop.v1.NoSuchService"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        stderr(&unknown).contains("NotFound"),
        "{}",
        stderr(&unknown)
    );

    // Once the process is gone, asking again until the wait is over still fails.
    drop(dev);
    let gone = health(&["--wait", "300ms"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(stderr(&gone).contains("cannot reach"), "{}", stderr(&gone));
}
