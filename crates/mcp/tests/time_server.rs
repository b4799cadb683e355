//! Against the reference stdio server `mcp-server-time` (PyPI: `pip install
//! mcp-server-time`): its tools as agentloop tools, and restarts when it dies.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

mod common;

use std::time::Duration;

use agentloop_mcp::{Health, Supervision};
use agentloop_proto::v1::{ErrorType, NextAction, SideEffect};
use common::*;
use serde_json::json;

const INSTALL: &str = "pip install mcp-server-time";

fn time_config() -> agentloop_mcp::McpServerConfig {
    config("name = \"time\"\ncommand = \"mcp-server-time\"\ntimeout_ms = 20000")
}

#[tokio::test]
async fn its_tools_are_described_with_schema_and_class_and_called() {
    if !available("mcp-server-time", INSTALL) {
        return;
    }
    let executor = start(time_config(), Supervision::default());
    let tools = describe(&executor).await;
    let current = tools
        .iter()
        .find(|t| t.name == "time__get_current_time")
        .unwrap_or_else(|| panic!("no time__get_current_time in {tools:?}"));
    assert!(
        tools.iter().any(|t| t.name == "time__convert_time"),
        "{tools:?}"
    );
    // readOnlyHint: true
    assert_eq!(current.side_effect, SideEffect::ReadOnly as i32);
    let schema: serde_json::Value = serde_json::from_str(&current.input_schema_json).unwrap();
    assert_eq!(schema["type"], "object");
    assert_eq!(schema["properties"]["timezone"]["type"], "string");
    assert_eq!(schema["required"], json!(["timezone"]));
    assert!(!current.description.is_empty());
    assert_eq!(current.timeout.unwrap().seconds, 20);

    // Its structured content is the output.
    let now = output(
        call(
            &executor,
            "time__get_current_time",
            json!({"timezone": "UTC"}),
        )
        .await
        .unwrap(),
    );
    assert_eq!(now["timezone"], "UTC");
    assert!(
        now["datetime"].as_str().unwrap().ends_with("+00:00"),
        "{now}"
    );

    // isError: true is a tool error the model reads, not a failure of the executor.
    let error = tool_error(
        call(
            &executor,
            "time__get_current_time",
            json!({"timezone": "Not/AZone"}),
        )
        .await
        .unwrap(),
    );
    assert_eq!(error.error_type, ErrorType::Rejected as i32);
    assert!(
        error.message.contains("Invalid timezone"),
        "{}",
        error.message
    );
    assert!(!error.retryable);
    executor.shutdown().await;
}

#[tokio::test]
async fn a_killed_server_is_restarted_and_calls_meanwhile_are_unavailable() {
    if !available("mcp-server-time", INSTALL) {
        return;
    }
    // A backoff long enough that the call below meets the server down.
    let supervision =
        Supervision::default().with_backoff(Duration::from_secs(2), Duration::from_secs(2));
    let executor = start(time_config(), supervision);
    let (first, pid) = wait_up(&executor).await;
    let pid = pid.expect("a stdio server has a pid");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let down = wait_for(&executor, "the server going down", |h| {
        matches!(h, Health::Down { .. })
    })
    .await;
    let Health::Down { reason, .. } = down else {
        unreachable!()
    };
    assert!(
        reason.contains("exited") || reason.contains("closed"),
        "{reason}"
    );

    // Meanwhile: UNAVAILABLE at once, retryable, never a hang.
    let started = tokio::time::Instant::now();
    let error = tool_error(
        call(
            &executor,
            "time__get_current_time",
            json!({"timezone": "UTC"}),
        )
        .await
        .unwrap(),
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(error.error_type, ErrorType::Unavailable as i32);
    assert!(error.retryable);
    assert_eq!(error.next_allowed_action, NextAction::Retry as i32);
    assert!(
        error.message.contains("\"time\" is not connected"),
        "{}",
        error.message
    );

    // Then a new process serves the same call.
    let up = wait_for(
        &executor,
        "the restart",
        |h| matches!(h, Health::Up { connection, .. } if *connection > first),
    )
    .await;
    let Health::Up { pid: new_pid, .. } = up else {
        unreachable!()
    };
    assert_ne!(new_pid, Some(pid));
    let now = output(
        call(
            &executor,
            "time__get_current_time",
            json!({"timezone": "UTC"}),
        )
        .await
        .unwrap(),
    );
    assert_eq!(now["timezone"], "UTC");
    executor.shutdown().await;
}
