//! The spans and metrics of one invocation, exported to a real OTLP receiver (tonic):
//! the run is one trace under the caller's span, with `invoke_agent`, `chat {model}`,
//! `authorize`, `execute_tool {tool}` and `commit` as the GenAI conventions and
//! agentloop's own names say, and the orchestrator's and the model's counters move.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use agentloop_decision::DecisionServer;
use agentloop_orchestrator::{Api, OrchestratorConfig};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::orchestrator_service_server::OrchestratorService;
use agentloop_runtime::{Runtime, Workers};
use agentloop_stack::{InProcessDecision, Services, ServicesOptions, Wiring};
use agentloop_store::SqliteStore;
use agentloop_telemetry::metrics;
use agentloop_telemetry::receiver::{OtlpReceiver, ReceivedSpan};
use agentloop_telemetry::{Metrics, SpanKind, SpanStart};
use tokio_stream::StreamExt as _;
use tonic::Request;

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    spans
        .iter()
        .find(|span| span.name == name)
        .unwrap_or_else(|| panic!("no span {name:?} among {:?}", names(spans)))
}

fn names(spans: &[ReceivedSpan]) -> Vec<&str> {
    spans.iter().map(|span| span.name.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_invocation_is_one_trace_of_genai_spans_and_its_counters_move() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let telemetry = receiver
        .telemetry("agentloop-orchestrator", Metrics::new(), [])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let services = Services::start(Wiring::Embedded, ServicesOptions::new(dir.path().into()))
        .await
        .unwrap();
    let mut ports = services.ports();
    ports.decision = Arc::new(InProcessDecision(
        DecisionServer::new(None).with_telemetry(&telemetry),
    ));
    let config = OrchestratorConfig::default();
    let workers = Workers::in_process(&config.workers);
    let store = SqliteStore::open_in(&dir.path().join("events"))
        .await
        .unwrap();
    let runtime = Runtime::new(
        config.runtime(),
        Arc::new(store),
        ports,
        workers,
        telemetry.clone(),
    );
    let api = Api::new(runtime, None);

    // The caller's span: StartInvocation runs in its context, as a server span would.
    let caller = telemetry.span(SpanKind::Client, || SpanStart::new("caller", Vec::new()));
    let script = r#"{"turns": [
        {"tool_calls": [{"id": "c", "name": "lookup", "arguments": {"key": "profile"}}]},
        {"final": "done"}]}"#;
    let started = caller
        .scope(
            api.start_invocation(Request::new(pb::StartInvocationRequest {
                goal: "telemetry".into(),
                scripted_model_json: script.into(),
                ..Default::default()
            })),
        )
        .await
        .unwrap()
        .into_inner();
    caller.end();
    let id = started.invocation.unwrap().invocation_id;

    // The watch ends with the run; bounded, so a lost run fails instead of hanging.
    let mut watch = api
        .watch_invocation(Request::new(pb::WatchInvocationRequest {
            invocation_id: id.clone(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(item) = watch.next().await {
            item.unwrap();
        }
    })
    .await
    .expect("the invocation ends within 60 s");
    // The runner ends its span just after the last commit: what is buffered goes now,
    // and the wait covers a span that ended after the flush.
    telemetry.flush().await;
    let spans = receiver
        .wait_until(Duration::from_secs(30), |spans| {
            spans.iter().any(|span| {
                span.name.starts_with("invoke_agent")
                    && span.attributes.contains_key("agentloop.terminal_reason")
            })
        })
        .await;
    assert!(
        spans
            .iter()
            .any(|span| span.name.starts_with("invoke_agent")),
        "no invoke_agent span among {:?}",
        names(&spans)
    );

    let caller = named(&spans, "caller");
    let invoke = named(&spans, "invoke_agent default");
    assert!(
        spans.iter().all(|span| span.trace_id == caller.trace_id),
        "one trace: {spans:?}"
    );
    assert_eq!(
        invoke.parent_span_id.as_deref(),
        Some(caller.span_id.as_str())
    );
    assert_eq!(invoke.attributes["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(invoke.attributes["agentloop.invocation.id"], id);
    assert!(!invoke.attributes.contains_key("agentloop.resumed_by"));

    let got = api
        .get_invocation(Request::new(pb::GetInvocationRequest {
            invocation_id: id.clone(),
        }))
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap();
    let reason = &invoke.attributes["agentloop.terminal_reason"];
    assert_eq!(
        reason,
        &pb::TerminalReason::try_from(got.terminal_reason)
            .unwrap()
            .as_str_name()
            .trim_start_matches("TERMINAL_REASON_")
            .to_lowercase()
    );

    let under_invoke = |name: &str| {
        let span = named(&spans, name);
        assert_eq!(
            span.parent_span_id.as_deref(),
            Some(invoke.span_id.as_str()),
            "{name} is a child of invoke_agent"
        );
        span
    };
    let chat = under_invoke("chat scripted");
    assert_eq!(chat.kind, 3, "a chat span is a client span");
    assert_eq!(chat.attributes["gen_ai.operation.name"], "chat");
    assert_eq!(chat.attributes["gen_ai.provider.name"], "scripted");
    assert_eq!(chat.attributes["gen_ai.request.model"], "scripted");
    assert_eq!(chat.attributes["gen_ai.response.model"], "scripted");
    assert!(chat.attributes.contains_key("gen_ai.usage.input_tokens"));
    assert!(chat.attributes.contains_key("gen_ai.usage.output_tokens"));
    let tool = under_invoke("execute_tool lookup");
    assert_eq!(tool.attributes["gen_ai.operation.name"], "execute_tool");
    assert_eq!(tool.attributes["gen_ai.tool.name"], "lookup");
    assert_eq!(tool.attributes["gen_ai.tool.call.id"], "c");
    assert_eq!(tool.attributes["agentloop.tool.outcome"], "output");
    assert!(
        !tool.attributes.contains_key("gen_ai.tool.call.arguments"),
        "no content unless it is opted in"
    );
    let authorize = under_invoke("authorize");
    assert_eq!(authorize.attributes["agentloop.policy.verdict"], "allow");
    assert_eq!(authorize.attributes["agentloop.turn"], "1");
    let commit = under_invoke("commit");
    assert!(commit.attributes.contains_key("agentloop.commit.events"));

    let text = telemetry.metrics().encode();
    let line = |series: &str| {
        metrics::sample(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    assert_eq!(line("agentloop_invocations_started_total"), 1.0);
    assert_eq!(
        line(&format!(
            "agentloop_invocations_ended_total{{reason=\"{reason}\"}}"
        )),
        1.0
    );
    assert_eq!(line("agentloop_turn_duration_seconds_count"), 2.0);
    assert!(line("agentloop_commit_duration_seconds_count") >= 2.0);
    assert_eq!(
        line(
            "agentloop_model_call_duration_seconds_count{provider=\"scripted\",model=\"scripted\",outcome=\"ok\"}"
        ),
        2.0
    );
    assert_eq!(line("agentloop_invocations_running"), 0.0);
    assert_eq!(line("agentloop_leases_held"), 0.0);
    services.stop().await.unwrap();
}
