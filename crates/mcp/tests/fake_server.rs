//! Against `tests/fake_mcp_server.py`: cancellation as the server sees it, and servers
//! that misbehave (garbage, oversized messages and outputs, endless tool lists).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

mod common;

use std::time::Duration;

use agentloop_mcp::{Health, Supervision};
use agentloop_proto::v1::tool_executor_service_server::ToolExecutorService;
use agentloop_proto::v1::{
    ErrorType, NextAction, ReconcileStatus, SideEffect, ToolExecutorServiceReconcileRequest,
    ToolExecutorServiceVerifyRequest,
};
use common::*;
use serde_json::json;
use tonic::{Code, Request};

const INSTALL: &str = "apt-get install python3";

fn have_python() -> bool {
    available("python3", INSTALL)
}

/// The fake server's record of calls started and cancellations received.
async fn cancellations(executor: &agentloop_mcp::McpExecutor) -> serde_json::Value {
    output(
        call(executor, "fake__cancellations", json!({}))
            .await
            .unwrap(),
    )
}

#[tokio::test]
async fn a_call_whose_future_is_dropped_is_cancelled_at_the_server() {
    if !have_python() {
        return;
    }
    let executor = start(fake_config("fake", "normal"), Supervision::default());
    wait_up(&executor).await;
    let running = {
        let executor = std::sync::Arc::clone(&executor);
        tokio::spawn(async move { call(&executor, "fake__sleep", json!({"seconds": 120})).await })
    };
    // The server has the call before the caller goes away...
    let started = eventually("started call", || async {
        let record = cancellations(&executor).await;
        record["started"].as_array().unwrap().first().cloned()
    })
    .await;
    running.abort();
    // ...and hears that it was cancelled, for that very request.
    let cancelled = eventually("cancellation at the server", || async {
        let record = cancellations(&executor).await;
        record["cancelled"].as_array().unwrap().first().cloned()
    })
    .await;
    assert_eq!(cancelled["id"], started);
    assert!(
        cancelled["reason"].as_str().unwrap().contains("went away"),
        "{cancelled}"
    );
    executor.shutdown().await;
}

#[tokio::test]
async fn a_write_past_its_deadline_is_cancelled_and_its_outcome_left_unknown() {
    if !have_python() {
        return;
    }
    let executor = start(fake_config("fake", "normal"), Supervision::default());
    wait_up(&executor).await;
    let mut request = call_request("fake__sleep", json!({"seconds": 120}), "effect-1");
    // As the gateway does: the call's deadline travels as grpc-timeout.
    request.set_timeout(Duration::from_millis(300));
    let status = executor.execute(request).await.unwrap_err();
    // A status, not a result: the gateway makes a write's outcome `unknown` from it.
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("\"fake\""),
        "{}",
        status.message()
    );
    let record = cancellations(&executor).await;
    let cancelled = &record["cancelled"][0];
    assert_eq!(cancelled["id"], record["started"][0]);
    assert!(
        cancelled["reason"].as_str().unwrap().contains("deadline"),
        "{record}"
    );
    executor.shutdown().await;
}

#[tokio::test]
async fn results_errors_and_refusals_of_a_well_behaved_server() {
    if !have_python() {
        return;
    }
    let mut config = fake_config("fake", "paged");
    config.idempotent = vec!["fail".to_owned()];
    let executor = start(config, Supervision::default());
    // Seven tools in pages of two: every page is followed.
    let tools = describe(&executor).await;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "fake__echo",
            "fake__meta",
            "fake__fail",
            "fake__sleep",
            "fake__cancellations",
            "fake__big_output",
            "fake__huge_line",
            "fake__garbage"
        ]
    );
    assert_eq!(tools[0].side_effect, SideEffect::ReadOnly as i32);
    assert_eq!(tools[2].side_effect, SideEffect::IdempotentWrite as i32);

    assert_eq!(
        output(
            call(&executor, "fake__echo", json!({"text": "hi"}))
                .await
                .unwrap()
        ),
        "hi"
    );
    // A write carries its effect key in _meta, for servers that dedupe; a read does not.
    let write = executor
        .execute(call_request("fake__meta", json!({}), "effect-9"))
        .await
        .unwrap();
    let meta = output(write.into_inner().result.unwrap().outcome.unwrap());
    assert_eq!(meta[agentloop_mcp::EFFECT_KEY_META], "effect-9");
    let read = output(call(&executor, "fake__meta", json!({})).await.unwrap());
    assert!(read.get(agentloop_mcp::EFFECT_KEY_META).is_none(), "{read}");
    let failed = tool_error(call(&executor, "fake__fail", json!({})).await.unwrap());
    assert_eq!(failed.error_type, ErrorType::Rejected as i32);
    assert_eq!(failed.message, "it failed on purpose");
    // A JSON-RPC error is the server refusing the call: a definite answer.
    let unknown = tool_error(call(&executor, "fake__nope", json!({})).await.unwrap());
    assert_eq!(unknown.error_type, ErrorType::InvalidArguments as i32);
    assert!(
        unknown.message.contains("Unknown tool"),
        "{}",
        unknown.message
    );
    // Arguments that are not an object never leave the gateway.
    let bad = executor
        .execute(call_request("fake__echo", json!([1]), ""))
        .await
        .unwrap();
    let bad = tool_error(bad.into_inner().result.unwrap().outcome.unwrap());
    assert_eq!(bad.next_allowed_action, NextAction::FixArguments as i32);
    // A tool of another server is refused as a malformed request.
    let other = call(&executor, "time__get_current_time", json!({}))
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::InvalidArgument);

    // MCP has no reconcile: an idempotent tool may go again, anything else is unknown.
    let reconcile = |tool: &str| {
        Request::new(ToolExecutorServiceReconcileRequest {
            tool: tool.to_owned(),
            effect_key: "k".to_owned(),
        })
    };
    let idempotent = executor
        .reconcile(reconcile("fake__fail"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(idempotent.status, ReconcileStatus::NotApplied as i32);
    let plain = executor
        .reconcile(reconcile("fake__echo"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plain.status, ReconcileStatus::Unknown as i32);
    assert!(
        plain.detail.contains("MCP has no reconcile"),
        "{}",
        plain.detail
    );
    let verify = executor
        .verify(Request::new(ToolExecutorServiceVerifyRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(verify.code(), Code::Unimplemented);
    executor.shutdown().await;
    assert_eq!(executor.health(), Health::Stopped);
    let stopped = tool_error(
        call(&executor, "fake__echo", json!({"text": "x"}))
            .await
            .unwrap(),
    );
    assert_eq!(stopped.error_type, ErrorType::Unavailable as i32);
}

#[tokio::test]
async fn an_output_beyond_the_bound_is_a_structured_error_for_a_read() {
    if !have_python() {
        return;
    }
    let executor = start(fake_config("fake", "normal"), Supervision::default());
    wait_up(&executor).await;
    let error = tool_error(
        call(&executor, "fake__big_output", json!({}))
            .await
            .unwrap(),
    );
    assert_eq!(error.error_type, ErrorType::Internal as i32);
    assert!(
        error.message.contains("larger than 1048576"),
        "{}",
        error.message
    );
    // A write that succeeded says so even when its output is too large to keep.
    let write = executor
        .execute(call_request("fake__big_output", json!({}), "effect-2"))
        .await
        .unwrap();
    let note = output(write.into_inner().result.unwrap().outcome.unwrap());
    assert_eq!(note["error"], "output_too_large");
    // The server was not cut off for it.
    assert_eq!(
        output(
            call(&executor, "fake__echo", json!({"text": "still"}))
                .await
                .unwrap()
        ),
        "still"
    );
    executor.shutdown().await;
}

/// Calls `tool`, which makes the fake break the protocol, and checks the server is cut
/// off with a structured error naming it, then reconnected.
async fn cut_off_and_reconnected(tool: &str, expected: &str) {
    let executor = start(fake_config("fake", "normal"), Supervision::default());
    let (first, _) = wait_up(&executor).await;
    let status = call(&executor, tool, json!({})).await.unwrap_err();
    // INTERNAL: a read gets a non-retryable error, a write an unknown outcome.
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        status.message().contains("\"fake\" was cut off"),
        "{}",
        status.message()
    );
    assert!(status.message().contains(expected), "{}", status.message());
    wait_for(
        &executor,
        "reconnection",
        |h| matches!(h, Health::Up { connection, .. } if *connection > first),
    )
    .await;
    assert_eq!(
        output(
            call(&executor, "fake__echo", json!({"text": "back"}))
                .await
                .unwrap()
        ),
        "back"
    );
    executor.shutdown().await;
}

#[tokio::test]
async fn a_server_that_writes_garbage_is_cut_off() {
    if !have_python() {
        return;
    }
    cut_off_and_reconnected("fake__garbage", "not JSON").await;
}

#[tokio::test]
async fn a_message_beyond_the_bound_cuts_the_server_off() {
    if !have_python() {
        return;
    }
    cut_off_and_reconnected("fake__huge_line", "larger than 4194304 bytes").await;
}

#[tokio::test]
async fn a_server_with_thousands_of_tools_is_cut_off() {
    if !have_python() {
        return;
    }
    let executor = start(fake_config("fake", "many-tools"), Supervision::default());
    let (first, _) = wait_up(&executor).await;
    let status = executor
        .describe(Request::new(agentloop_proto::v1::DescribeRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("more than 256 tools"),
        "{}",
        status.message()
    );
    // Cut off: the connection ends and a new one is made.
    wait_for(
        &executor,
        "reconnection",
        |h| matches!(h, Health::Up { connection, .. } if *connection > first),
    )
    .await;
    executor.shutdown().await;
}

#[tokio::test]
async fn a_server_that_prints_a_banner_never_comes_up_and_calls_fail_at_once() {
    if !have_python() {
        return;
    }
    // A long backoff keeps it down while the call is made.
    let supervision =
        Supervision::default().with_backoff(Duration::from_secs(5), Duration::from_secs(5));
    let executor = start(fake_config("fake", "banner"), supervision);
    let down = wait_for(&executor, "failed start", |h| {
        matches!(h, Health::Down { .. })
    })
    .await;
    let Health::Down { reason, .. } = down else {
        unreachable!()
    };
    assert!(reason.contains("not JSON"), "{reason}");
    let started = tokio::time::Instant::now();
    let error = tool_error(
        call(&executor, "fake__echo", json!({"text": "x"}))
            .await
            .unwrap(),
    );
    assert_eq!(error.error_type, ErrorType::Unavailable as i32);
    assert!(error.retryable);
    assert!(error.message.contains("not JSON"), "{}", error.message);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    executor.shutdown().await;
}

#[tokio::test]
async fn an_http_server_that_is_not_there_is_down_and_calls_fail_at_once() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = config(&format!(
        "name = \"gone\"\nurl = \"http://127.0.0.1:{port}/mcp\""
    ));
    let supervision =
        Supervision::default().with_backoff(Duration::from_secs(5), Duration::from_secs(5));
    let executor = start(config, supervision);
    let down = wait_for(&executor, "failed start", |h| {
        matches!(h, Health::Down { .. })
    })
    .await;
    let Health::Down { reason, .. } = down else {
        unreachable!()
    };
    assert!(reason.contains("initialization failed"), "{reason}");
    let error = tool_error(call(&executor, "gone__x", json!({})).await.unwrap());
    assert_eq!(error.error_type, ErrorType::Unavailable as i32);
    assert!(error.retryable);
    let status = executor
        .describe(Request::new(agentloop_proto::v1::DescribeRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    executor.shutdown().await;
}
