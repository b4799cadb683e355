//! The embedded default observed as the services are: `agentloop run` exports an
//! invocation as one trace to a real OTLP receiver (tonic) before it exits, read from the
//! same `OTEL_*` variables, and `agentloop dev --metrics` serves `/metrics`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use agentloop_telemetry::receiver::{OtlpReceiver, ReceivedSpan};
use common::{agentloop, stderr};

const SCRIPT: &str = r#"{"turns": [
  {"tool_calls": [{"id": "p", "name": "lookup", "arguments": {"key": "profile"}},
                  {"id": "q", "name": "lookup", "arguments": {"key": "policy"}}]},
  {"tool_calls": [{"id": "r", "name": "lookup", "arguments": {"key": "profile"}}]},
  {"final": "profile and policy read"}]}"#;

fn operation<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|span| span.attribute("gen_ai.operation.name") == Some(name))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_run_is_one_trace_exported_before_it_exits() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.json"), SCRIPT).unwrap();
    let endpoint = receiver.endpoint().to_owned();
    let path = dir.path().to_owned();
    let output = tokio::task::spawn_blocking(move || {
        agentloop(&path)
            .args(["--data-dir", "data", "run", "--script", "s.json", "--json"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
            .env("OTEL_SERVICE_NAME", "agentloop-embedded")
            .env_remove("OTEL_SDK_DISABLED")
            .env_remove("OTEL_TRACES_SAMPLER")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let id = summary["invocation_id"].as_str().unwrap();

    // Read at once: the process flushed its spans before it exited.
    let spans = receiver.spans();
    let invoke = operation(&spans, "invoke_agent");
    assert_eq!(invoke.len(), 1, "one invoke_agent span: {spans:#?}");
    let invoke = invoke[0];
    assert_eq!(invoke.name, "invoke_agent default");
    assert_eq!(invoke.service, "agentloop-embedded");
    assert_eq!(invoke.attribute("agentloop.invocation.id"), Some(id));
    assert_eq!(
        invoke.attribute("agentloop.terminal_reason"),
        Some("completed")
    );
    let trace: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|span| span.trace_id == invoke.trace_id)
        .collect();
    let in_trace = |name: &str| -> Vec<&ReceivedSpan> {
        trace
            .iter()
            .copied()
            .filter(|span| span.attribute("gen_ai.operation.name") == Some(name))
            .collect()
    };
    // Every GenAI span of the run is in the invocation's trace, under its span.
    assert_eq!(operation(&spans, "chat").len(), in_trace("chat").len());
    assert_eq!(
        operation(&spans, "execute_tool").len(),
        in_trace("execute_tool").len()
    );

    let chats = in_trace("chat");
    assert_eq!(chats.len(), 3, "a chat span per model call: {chats:#?}");
    for chat in &chats {
        assert_eq!(chat.name, "chat scripted");
        assert_eq!(
            chat.parent_span_id.as_deref(),
            Some(invoke.span_id.as_str())
        );
        assert!(chat.attributes.contains_key("gen_ai.usage.input_tokens"));
        assert!(chat.attributes.contains_key("gen_ai.usage.output_tokens"));
    }
    let mut calls: Vec<&str> = in_trace("execute_tool")
        .iter()
        .map(|span| {
            assert_eq!(span.name, "execute_tool lookup");
            assert_eq!(
                span.parent_span_id.as_deref(),
                Some(invoke.span_id.as_str())
            );
            span.attribute("gen_ai.tool.call.id").unwrap()
        })
        .collect();
    calls.sort_unstable();
    assert_eq!(calls, ["p", "q", "r"], "an execute_tool span per call");
}

/// `agentloop dev` on a free port, without HTTP, over `data`.
const DEV: [&str; 7] = [
    "--data-dir",
    "data",
    "dev",
    "--listen",
    "127.0.0.1:0",
    "--http",
    "off",
];

#[test]
fn dev_serves_metrics_where_told_and_they_move() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.json"), SCRIPT).unwrap();
    let mut child = agentloop(dir.path())
        .args(DEV)
        .args(["--metrics", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = || {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        line.trim().rsplit(' ').next().unwrap().to_owned()
    };
    let endpoint = line();
    let metrics = line();
    let address = metrics
        .strip_prefix("http://")
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics URL in {metrics:?}"))
        .to_owned();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let scrape = || {
        runtime
            .block_on(agentloop_telemetry::scrape::get(&address))
            .unwrap()
    };
    let started = |text: &str| {
        agentloop_telemetry::metrics::sample(text, "agentloop_invocations_started_total")
            .unwrap_or(0.0)
    };
    assert_eq!(started(&scrape()), 0.0);

    let output = agentloop(dir.path())
        .args(["run", "--server", &endpoint, "--script", "s.json", "--json"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = scrape();
    assert_eq!(started(&text), 1.0, "{text}");
    assert_eq!(
        agentloop_telemetry::metrics::sample(
            &text,
            "agentloop_invocations_ended_total{reason=\"completed\"}"
        ),
        Some(1.0),
        "{text}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_metrics_address_that_cannot_be_bound_is_a_bad_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let output = agentloop(dir.path())
        .args(DEV)
        .args(["--metrics", &address])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(78), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(&format!("cannot serve /metrics on {address}")),
        "{}",
        stderr(&output)
    );
}
