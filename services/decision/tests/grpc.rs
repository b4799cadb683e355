#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]
//! DecisionService over real gRPC on 127.0.0.1 port 0, with the generated client.

use std::sync::Arc;
use std::time::Duration;

use agentloop_decision::{DecisionConfig, DecisionServer, ScriptedModel};
use agentloop_proto::client::Transport;
use agentloop_proto::v1::decide_response::Outcome;
use agentloop_proto::v1::decision::Kind;
use agentloop_proto::v1::decision_service_client::DecisionServiceClient;
use agentloop_proto::v1::{DecideRequest, DecideResponse};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Code;

const SCRIPT: &str = r#"{"turns": [
    {"tool_calls": [{"id": "c1", "name": "lookup", "arguments": {"n": 123456789012345678901234567890}}],
     "usage": {"input_tokens": 7, "output_tokens": 2, "cost_micro_usd": 40}},
    {"raw": "I think I will {call"},
    {"model_error": "rate limited"},
    {"final": "done"}
]}"#;

async fn start(server: DecisionServer) -> DecisionServiceClient<Transport> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(agentloop_proto::server::decision(server))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let channel = agentloop_proto::client::connect(
        &format!("http://{addr}"),
        agentloop_proto::client::ClientConfig::default(),
    )
    .await
    .unwrap();
    agentloop_proto::client::decision(channel)
}

fn request(turn: u32, script: &str) -> DecideRequest {
    DecideRequest {
        invocation_id: "inv-1".into(),
        turn,
        scripted_model_json: script.into(),
        ..DecideRequest::default()
    }
}

async fn decide(
    client: &mut DecisionServiceClient<Transport>,
    req: DecideRequest,
) -> Result<DecideResponse, tonic::Status> {
    client.decide(req).await.map(tonic::Response::into_inner)
}

#[tokio::test]
async fn turns_map_to_script_entries() {
    let mut client = start(DecisionServer::new(None)).await;

    let first = decide(&mut client, request(1, SCRIPT)).await.unwrap();
    let Some(Outcome::Decision(decision)) = first.outcome else {
        panic!("{first:?}")
    };
    let Some(Kind::ToolCalls(batch)) = decision.kind else {
        panic!("{decision:?}")
    };
    assert_eq!(batch.calls.len(), 1);
    assert_eq!(batch.calls[0].call_id, "c1");
    assert_eq!(batch.calls[0].tool, "lookup");
    assert_eq!(
        batch.calls[0].arguments_json,
        r#"{"n": 123456789012345678901234567890}"#
    );
    let usage = first.usage.unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.output_tokens,
            usage.cost_micro_usd
        ),
        (7, 2, Some(40))
    );
    assert_eq!(first.model, "scripted");

    let second = decide(&mut client, request(2, SCRIPT)).await.unwrap();
    let Some(Outcome::Invalid(invalid)) = second.outcome else {
        panic!("{second:?}")
    };
    assert_eq!(invalid.raw, "I think I will {call");
    assert!(!invalid.reason.is_empty());

    let third = decide(&mut client, request(3, SCRIPT)).await.unwrap_err();
    assert_eq!(third.code(), Code::Unavailable);
    assert!(
        third.message().contains("rate limited"),
        "{}",
        third.message()
    );

    let fourth = decide(&mut client, request(4, SCRIPT)).await.unwrap();
    let Some(Outcome::Decision(decision)) = fourth.outcome else {
        panic!("{fourth:?}")
    };
    assert_eq!(
        decision.kind,
        Some(Kind::Final(agentloop_proto::v1::decision::Final {
            answer: "done".into(),
            evidence: Vec::new(),
        }))
    );

    let past = decide(&mut client, request(5, SCRIPT)).await.unwrap_err();
    assert_eq!(past.code(), Code::FailedPrecondition);
    assert_eq!(
        past.message(),
        "scripted model has no turn 5 (it has 4 turns and repeat_last is false)"
    );
}

#[tokio::test]
async fn repeat_last_answers_past_the_end() {
    let mut client = start(DecisionServer::new(None)).await;
    let script = r#"{"turns": [{"clarification": "a?"}, {"cannot_continue": "stuck"}], "repeat_last": true}"#;
    for turn in [2, 3, 100] {
        let reply = decide(&mut client, request(turn, script)).await.unwrap();
        let Some(Outcome::Decision(decision)) = reply.outcome else {
            panic!("{reply:?}")
        };
        assert!(
            matches!(decision.kind, Some(Kind::CannotContinue(ref c)) if c.reason == "stuck"),
            "{decision:?}"
        );
    }
}

#[tokio::test]
async fn bad_input_is_invalid_argument() {
    let mut client = start(DecisionServer::new(None)).await;
    let mut missing_id = request(1, SCRIPT);
    missing_id.invocation_id.clear();
    let status = decide(&mut client, missing_id).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("invocation_id"),
        "{}",
        status.message()
    );

    let status = decide(&mut client, request(0, SCRIPT)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("turn"), "{}", status.message());

    let status = decide(
        &mut client,
        request(1, r#"{"turns": [{"final": "a"}, {"finale": "b"}]}"#),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("$.turns[1]: unknown field `finale`"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn without_a_script_the_configured_default_answers() {
    let mut bare = start(DecisionServer::new(None)).await;
    let status = decide(&mut bare, request(1, "")).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("script_file"),
        "{}",
        status.message()
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.json");
    std::fs::write(&path, r#"{"turns": [{"final": "from the file"}]}"#).unwrap();
    let config = DecisionConfig {
        script_file: Some(path),
        ..DecisionConfig::default()
    };
    let mut client = start(DecisionServer::from_config(&config).unwrap()).await;
    let reply = decide(&mut client, request(1, "")).await.unwrap();
    let Some(Outcome::Decision(decision)) = reply.outcome else {
        panic!("{reply:?}")
    };
    assert!(matches!(decision.kind, Some(Kind::Final(ref f)) if f.answer == "from the file"));
    // A script in the request wins over the default.
    let reply = decide(&mut client, request(4, SCRIPT)).await.unwrap();
    assert!(matches!(reply.outcome, Some(Outcome::Decision(_))));

    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"turns": []}"#).unwrap();
    let error = DecisionServer::from_config(&DecisionConfig {
        script_file: Some(bad),
        ..DecisionConfig::default()
    })
    .unwrap_err();
    assert!(error.to_string().contains("at least one turn"), "{error}");
    let missing = DecisionConfig {
        script_file: Some(dir.path().join("nope.json")),
        ..DecisionConfig::default()
    };
    assert!(DecisionServer::from_config(&missing).is_err());
}

#[tokio::test]
async fn a_timed_out_slow_turn_returns_promptly_and_the_server_goes_on() {
    let mut client = start(DecisionServer::new(None)).await;
    let slow = r#"{"turns": [{"final": "late", "delay_ms": 600000}, {"final": "quick"}]}"#;
    let mut req = tonic::Request::new(request(1, slow));
    req.set_timeout(Duration::from_millis(50));
    // The outer bound only turns a hang into a failure; the client deadline is the test.
    let status = tokio::time::timeout(Duration::from_secs(30), client.decide(req))
        .await
        .expect("the client deadline did not end a 10-minute turn")
        .unwrap_err();
    assert!(
        matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{status:?}"
    );
    let reply = decide(&mut client, request(2, slow)).await.unwrap();
    assert!(matches!(reply.outcome, Some(Outcome::Decision(_))));
}

#[tokio::test(start_paused = true)]
async fn delay_is_honoured_and_cancellable() {
    let server = DecisionServer::new(Some(Arc::new(
        ScriptedModel::parse(r#"{"turns": [{"final": "a", "delay_ms": 5000}]}"#).unwrap(),
    )));
    let started = tokio::time::Instant::now();
    server.decide(&request(1, "")).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(5000));

    let started = tokio::time::Instant::now();
    let cut = tokio::time::timeout(Duration::from_millis(10), server.decide(&request(1, ""))).await;
    assert!(cut.is_err(), "the delay should still have been running");
    assert_eq!(started.elapsed(), Duration::from_millis(10));
}
