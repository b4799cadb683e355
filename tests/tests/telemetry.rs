//! Telemetry across the distributed stack, as an operator sees it: every service exports
//! its spans over OTLP (to a real receiver, the collector's TraceService over tonic)
//! under its own `service.name`, and serves its own `/metrics`.
//!
//! One invocation that reads, waits for an approval, then writes is one trace across
//! the caller and all six services: every span's parent is in the trace, the
//! resumed run continues (and links to) the run before the wait, and the GenAI spans
//! carry their attributes. A scrape of each service's `/metrics` shows what the run did.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use agentloop_e2e::*;
use agentloop_stack::{ServiceTelemetry, Stack, StackOptions};
use agentloop_telemetry::receiver::{OtlpReceiver, ReceivedSpan};
use agentloop_telemetry::{Metrics, SpanKind, SpanStart};
use agentloop_telemetry::{metrics, scrape};
use tokio_util::sync::CancellationToken;

/// Turn 1 reads; turn 2 asks for an approval of one transfer; turn 3 answers.
const SCRIPT: &str = r#"{"turns": [
  {"tool_calls": [{"id": "l1", "name": "lookup", "arguments": {"key": "profile"}}]},
  {"request_approval": {"summary": "move 42.00 from alice to bob", "calls": [
    {"id": "t1", "name": "transfer", "arguments": {"from": "alice", "to": "bob", "amount": 4200}}]}},
  {"final": "moved"}]}"#;

/// The services, by the `service.name` each exports under.
const SERVICES: [&str; 6] = [
    "agentloop-orchestrator",
    "agentloop-decision",
    "agentloop-policy",
    "agentloop-tools",
    "agentloop-ledger",
    "agentloop-demo-executor",
];

/// Serves `metrics` on `/metrics` of a free port, until `stop`; its address.
async fn serve_metrics(metrics: Metrics, stop: &CancellationToken) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let stopped = stop.clone().cancelled_owned();
    tokio::spawn(agentloop_telemetry::metrics::serve(
        listener, metrics, stopped,
    ));
    address
}

/// `GET /metrics` of `address`: the samples, by series (`name{labels}`).
async fn scrape(address: &str) -> BTreeMap<String, f64> {
    metrics::samples(&scrape::get(address).await.unwrap())
}

fn named<'a>(spans: &'a [ReceivedSpan], service: &str, name: &str) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|span| span.service == service && span.name == name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_invocation_is_one_trace_across_every_service_and_each_one_counts_it() {
    agentloop_server::install_crypto_provider();
    let receiver = OtlpReceiver::start().await.unwrap();
    let of = |service: &str| receiver.telemetry(service, Metrics::new(), []).unwrap();
    let orchestrator = of(SERVICES[0]);
    let services = ServiceTelemetry {
        decision: of(SERVICES[1]),
        policy: of(SERVICES[2]),
        tools: of(SERVICES[3]),
        ledger: of(SERVICES[4]),
        demo_executor: of(SERVICES[5]),
    };
    let every = [
        &orchestrator,
        &services.decision,
        &services.policy,
        &services.tools,
        &services.ledger,
        &services.demo_executor,
    ]
    .map(Clone::clone);
    let dir = tempfile::tempdir().unwrap();
    let mut options = StackOptions {
        wiring: Wiring::Distributed,
        telemetry: orchestrator,
        ..StackOptions::embedded(dir.path().join("data"))
    };
    options.services.telemetry = services;
    let stack = Stack::start(options).await.unwrap();
    let stop = CancellationToken::new();
    let mut scraped = Vec::new();
    for telemetry in &every {
        scraped.push(serve_metrics(telemetry.metrics().clone(), &stop).await);
    }
    let mut client = client_of(&stack).await;

    // The caller's span: its context goes out with StartInvocation (`traceparent`).
    let caller_telemetry = of("e2e-caller");
    let caller = caller_telemetry.span(SpanKind::Client, || SpanStart::new("caller", Vec::new()));
    let (id, _, end) = caller
        .scope(start_waiting(&mut client, start_request(SCRIPT)))
        .await;
    caller.end();
    approve(&mut client, &id, &end.proposal_digest)
        .await
        .unwrap();
    let events = events_until_final_end(&mut client, &id).await;
    let reason = reason(&get(&mut client, &id).await);
    assert_eq!(
        reason,
        agentloop_proto::v1::TerminalReason::Completed,
        "{events:?}"
    );
    assert_eq!(applied_for(stack.demo_executor(), &id).len(), 1);

    for telemetry in every.iter().chain([&caller_telemetry]) {
        telemetry.flush().await;
    }
    // The resumed run's span ends just after its last commit: wait for it too.
    let spans = receiver
        .wait_until(Duration::from_secs(30), |spans| {
            spans
                .iter()
                .filter(|span| span.name == "invoke_agent default")
                .count()
                == 2
                && SERVICES
                    .iter()
                    .all(|service| spans.iter().any(|span| span.service == *service))
        })
        .await;

    // One trace, every span's parent in it: nothing is cut off at a hop. The test's
    // later calls (the approval, the watches, the reads) are not under the caller's
    // span, so each is a trace of its own with the orchestrator's server span alone;
    // so is the services' own upkeep (policy listing the tools, the gateway describing
    // its executors).
    let caller = named(&spans, "e2e-caller", "caller")[0].clone();
    let (spans, others): (Vec<ReceivedSpan>, Vec<ReceivedSpan>) = spans
        .into_iter()
        .partition(|span| span.trace_id == caller.trace_id);
    for other in &others {
        assert!(
            other.parent_span_id.is_none()
                && (other.name.starts_with("agentloop.v1.OrchestratorService/")
                    || other.name == "agentloop.v1.ToolGatewayService/ListTools"
                    || other.name == "agentloop.v1.ToolExecutorService/Describe"
                    || other.name.starts_with("grpc.health.v1.Health/")),
            "only the test's own untraced calls are other traces: {other:?}"
        );
    }
    let by_id: HashMap<&str, &ReceivedSpan> = spans
        .iter()
        .map(|span| (span.span_id.as_str(), span))
        .collect();
    for span in &spans {
        if span.span_id != caller.span_id {
            let parent = span.parent_span_id.as_deref().unwrap_or_default();
            assert!(
                by_id.contains_key(parent),
                "the parent of {span:?} is in the trace"
            );
        }
    }
    let exported: BTreeSet<&str> = spans.iter().map(|span| span.service.as_str()).collect();
    for service in SERVICES {
        assert!(
            exported.contains(service),
            "{service} exported: {exported:?}"
        );
    }

    // The invocation: under the orchestrator's StartInvocation, then resumed after the
    // approval as the child of the first run, linked to it.
    let start = named(
        &spans,
        SERVICES[0],
        "agentloop.v1.OrchestratorService/StartInvocation",
    )[0];
    assert_eq!(
        start.parent_span_id.as_deref(),
        Some(caller.span_id.as_str())
    );
    assert_eq!(start.kind, 2, "a server span");
    let runs = named(&spans, SERVICES[0], "invoke_agent default");
    let first = runs
        .iter()
        .find(|run| run.attribute("agentloop.resumed_by").is_none())
        .expect("the first run");
    let resumed = runs
        .iter()
        .find(|run| run.attribute("agentloop.resumed_by") == Some("reply"))
        .expect("the run after the approval");
    assert_eq!(
        first.parent_span_id.as_deref(),
        Some(start.span_id.as_str())
    );
    assert_eq!(
        first.attribute("agentloop.invocation.id"),
        Some(id.as_str())
    );
    assert_eq!(
        first.attribute("agentloop.terminal_reason"),
        Some("approval_required")
    );
    assert_eq!(
        first.attribute("gen_ai.operation.name"),
        Some("invoke_agent")
    );
    assert_eq!(
        resumed.parent_span_id.as_deref(),
        Some(first.span_id.as_str())
    );
    assert!(
        resumed
            .links
            .contains(&(first.trace_id.clone(), first.span_id.clone())),
        "{resumed:?}"
    );
    assert_eq!(
        resumed.attribute("agentloop.terminal_reason"),
        Some("completed")
    );

    // A model call: the decision service's server span under a run, its chat span under it.
    let chats = named(&spans, SERVICES[1], "chat scripted");
    assert_eq!(chats.len(), 3, "one chat per turn");
    for chat in &chats {
        let decide = by_id[chat.parent_span_id.as_deref().unwrap()];
        assert_eq!(decide.name, "agentloop.v1.DecisionService/Decide");
        let run = by_id[decide.parent_span_id.as_deref().unwrap()];
        assert!(run.name.starts_with("invoke_agent"), "{decide:?}");
        assert_eq!(chat.kind, 3, "a client span");
        assert_eq!(chat.attribute("gen_ai.operation.name"), Some("chat"));
        assert_eq!(chat.attribute("gen_ai.provider.name"), Some("scripted"));
        assert_eq!(chat.attribute("gen_ai.request.model"), Some("scripted"));
        assert!(chat.attribute("gen_ai.response.model").is_some());
        assert!(chat.attribute("gen_ai.usage.input_tokens").is_some());
        assert!(chat.attribute("gen_ai.usage.output_tokens").is_some());
    }

    // The write: its execute_tool span under the resumed run, the gateway's, the
    // executor's and the ledger's server spans under it.
    let transfer = named(&spans, SERVICES[0], "execute_tool transfer")[0];
    assert_eq!(
        transfer.parent_span_id.as_deref(),
        Some(resumed.span_id.as_str())
    );
    assert_eq!(transfer.attribute("gen_ai.tool.name"), Some("transfer"));
    assert_eq!(transfer.attribute("gen_ai.tool.call.id"), Some("t1"));
    assert_eq!(transfer.attribute("agentloop.tool.outcome"), Some("output"));
    let effect_key = transfer.attribute("agentloop.effect.key").unwrap();
    assert_eq!(effect_key.len(), 64);
    let under_transfer: BTreeSet<&str> = spans
        .iter()
        .filter(|span| span.parent_span_id.as_deref() == Some(transfer.span_id.as_str()))
        .map(|span| span.name.as_str())
        .collect();
    for rpc in [
        "agentloop.v1.ToolGatewayService/Execute",
        "agentloop.v1.EffectLedgerService/Prepare",
        "agentloop.v1.EffectLedgerService/MarkDispatched",
        "agentloop.v1.EffectLedgerService/Record",
    ] {
        assert!(
            under_transfer.contains(rpc),
            "{rpc} under the transfer: {under_transfer:?}"
        );
    }
    let gateway = spans
        .iter()
        .find(|span| {
            span.name == "agentloop.v1.ToolGatewayService/Execute"
                && span.parent_span_id.as_deref() == Some(transfer.span_id.as_str())
        })
        .unwrap();
    let executed = named(
        &spans,
        SERVICES[5],
        "agentloop.v1.ToolExecutorService/Execute",
    );
    assert!(
        executed
            .iter()
            .any(|span| span.parent_span_id.as_deref() == Some(gateway.span_id.as_str())),
        "the executor's span is under the gateway's: {executed:?}"
    );
    // The read and its authorization, under the first run.
    let lookup = named(&spans, SERVICES[0], "execute_tool lookup")[0];
    assert_eq!(
        lookup.parent_span_id.as_deref(),
        Some(first.span_id.as_str())
    );
    let authorized = named(&spans, SERVICES[0], "authorize");
    assert!(authorized.iter().any(|span| {
        span.parent_span_id.as_deref() == Some(first.span_id.as_str())
            && span.attribute("agentloop.policy.verdict") == Some("allow")
    }));
    let evaluate = named(&spans, SERVICES[2], "agentloop.v1.PolicyService/Evaluate");
    assert!(
        evaluate
            .iter()
            .all(|span| { by_id[span.parent_span_id.as_deref().unwrap()].name == "authorize" }),
        "policy is asked under authorize: {evaluate:?}"
    );
    assert!(!named(&spans, SERVICES[0], "commit").is_empty());
    assert!(
        spans
            .iter()
            .all(|span| span.attribute("gen_ai.tool.call.arguments").is_none()),
        "no content unless it is opted in"
    );

    // Each service's /metrics, scraped: what the run did.
    let [orchestrator, decision, policy, tools, ledger, executor] = &scraped[..] else {
        unreachable!()
    };
    let orchestrator = scrape(orchestrator).await;
    assert_eq!(orchestrator["agentloop_invocations_started_total"], 1.0);
    for reason in ["approval_required", "completed"] {
        assert_eq!(
            orchestrator[&format!("agentloop_invocations_ended_total{{reason=\"{reason}\"}}")],
            1.0,
            "{reason}"
        );
    }
    assert_eq!(orchestrator["agentloop_turn_duration_seconds_count"], 3.0);
    assert_eq!(orchestrator["agentloop_invocations_running"], 0.0);
    assert_eq!(
        orchestrator["agentloop_rpc_responses_total{service=\"agentloop.v1.OrchestratorService\",code=\"OK\"}"],
        // Start, Watch twice, ResolveApproval, GetInvocation.
        5.0
    );
    let decision = scrape(decision).await;
    assert_eq!(
        decision["agentloop_model_call_duration_seconds_count{provider=\"scripted\",model=\"scripted\",outcome=\"ok\"}"],
        3.0
    );
    // The scripted model uses no tokens; the counter is there all the same.
    assert!(decision.contains_key(
        "agentloop_model_tokens_total{provider=\"scripted\",model=\"scripted\",type=\"input\"}"
    ));
    let policy = scrape(policy).await;
    assert!(
        policy["agentloop_rpc_responses_total{service=\"agentloop.v1.PolicyService\",code=\"OK\"}"]
            >= 2.0
    );
    let tools = scrape(tools).await;
    for tool in ["lookup", "transfer"] {
        assert_eq!(
            tools[&format!(
                "agentloop_tool_call_duration_seconds_count{{tool=\"{tool}\",outcome=\"output\"}}"
            )],
            1.0,
            "{tool}"
        );
    }
    let ledger = scrape(ledger).await;
    for state in ["prepared", "dispatched", "committed"] {
        assert_eq!(
            ledger[&format!("agentloop_effect_transitions_total{{state=\"{state}\"}}")],
            1.0,
            "{state}"
        );
    }
    let executor = scrape(executor).await;
    assert!(
        executor["agentloop_rpc_responses_total{service=\"agentloop.v1.ToolExecutorService\",code=\"OK\"}"]
            >= 2.0
    );

    stop.cancel();
    stack.stop().await.unwrap();
}
