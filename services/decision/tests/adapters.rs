#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]
//! The OpenAI and Anthropic adapters against a local HTTP mock (wiremock) replaying
//! realistic response bodies; no test needs the internet, and no test sleeps: backoff
//! waits go through a recording sleeper.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop_decision::{
    AdapterDeps, AnthropicModel, DecisionConfig, DecisionServer, MAX_HISTORY_EVENTS, MapEnv, Model,
    ModelConfig, ModelError, ModelReply, OpenAiModel, Provider, Question, Sleeper,
};
use agentloop_proto::v1::decide_response::Outcome;
use agentloop_proto::v1::decision::{Kind, ToolCalls};
use agentloop_proto::v1::event::Body;
use agentloop_proto::v1::tool_result::Outcome as ResultOutcome;
use agentloop_proto::v1::{
    DecideRequest, Decision, ErrorType, Event, Rejection, RejectionKind, ToolCall, ToolDescriptor,
    ToolError, ToolOutput, ToolResult, TurnCommitted, Usage,
};
use serde_json::{Value, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[derive(Debug, Default)]
struct RecordingSleeper(Mutex<Vec<Duration>>);

#[async_trait::async_trait]
impl Sleeper for RecordingSleeper {
    async fn sleep(&self, delay: Duration) {
        self.0.lock().unwrap().push(delay);
    }
}

impl RecordingSleeper {
    fn delays(&self) -> Vec<Duration> {
        self.0.lock().unwrap().clone()
    }
}

const CUSTOMER_SCHEMA: &str = r#"{"type":"object","properties":{"customer_id":{"type":"string"}},"required":["customer_id"]}"#;

fn tools() -> Vec<ToolDescriptor> {
    vec![
        ToolDescriptor {
            name: "lookup_customer".into(),
            description: "Looks a customer up by ID".into(),
            input_schema_json: CUSTOMER_SCHEMA.into(),
            ..ToolDescriptor::default()
        },
        ToolDescriptor {
            name: "get_policy".into(),
            description: "Reads a policy".into(),
            input_schema_json: r#"{"type":"object","properties":{"topic":{"type":"string"}}}"#
                .into(),
            ..ToolDescriptor::default()
        },
    ]
}

fn call(id: &str, tool: &str, args: &str) -> ToolCall {
    ToolCall {
        call_id: id.into(),
        tool: tool.into(),
        arguments_json: args.into(),
    }
}

fn turn_event(seq: u64, turn: TurnCommitted) -> Event {
    Event {
        invocation_id: "inv-1".into(),
        seq,
        committed_at: None,
        body: Some(Body::Turn(turn)),
    }
}

fn calls_turn(turn: u32, calls: Vec<ToolCall>, results: Vec<ToolResult>) -> TurnCommitted {
    TurnCommitted {
        turn,
        decision: Some(Decision {
            kind: Some(Kind::ToolCalls(ToolCalls { calls })),
        }),
        results,
        usage: Some(Usage::default()),
        rejection: None,
        plan_digest: String::new(),
        ..TurnCommitted::default()
    }
}

fn output(call_id: &str, json: &str) -> ToolResult {
    ToolResult {
        call_id: call_id.into(),
        outcome: Some(ResultOutcome::Output(ToolOutput {
            output_json: json.into(),
            receipt: String::new(),
        })),
    }
}

/// Turn 3 of an invocation: turn 1 ran two parallel lookups (one failed), turn 2
/// proposed a final answer that verification rejected.
fn request() -> DecideRequest {
    let turn1 = calls_turn(
        1,
        vec![
            call("call_a", "lookup_customer", r#"{"customer_id":"C-42"}"#),
            call("call_b", "get_policy", r#"{"topic":"refunds"}"#),
        ],
        vec![
            output("call_a", r#"{"id":"C-42","tier":"gold"}"#),
            ToolResult {
                call_id: "call_b".into(),
                outcome: Some(ResultOutcome::Error(ToolError {
                    error_type: ErrorType::NotFound.into(),
                    message: "no policy named refunds".into(),
                    retryable: false,
                    next_allowed_action: 0,
                })),
            },
        ],
    );
    let turn2 = TurnCommitted {
        turn: 2,
        decision: Some(Decision {
            kind: Some(Kind::Final(agentloop_proto::v1::decision::Final {
                answer: "Gold.".into(),
                evidence: vec!["call_a".into()],
            })),
        }),
        results: vec![],
        usage: Some(Usage::default()),
        rejection: Some(Rejection {
            kind: RejectionKind::VerificationFailed.into(),
            message: "the answer must cite the policy".into(),
            refusals: Vec::new(),
        }),
        plan_digest: String::new(),
        ..TurnCommitted::default()
    };
    DecideRequest {
        invocation_id: "inv-1".into(),
        turn: 3,
        goal: "What tier is customer C-42 and may they get a refund?".into(),
        profile: "default".into(),
        tools: tools(),
        history: vec![turn_event(1, turn1), turn_event(2, turn2)],
        context_from_seq: 1,
        summary: String::new(),
        scripted_model_json: String::new(),
        history_left_out: 0,
        tools_left_out: false,
    }
}

struct Setup {
    server: MockServer,
    sleeper: Arc<RecordingSleeper>,
    model: Arc<dyn Model>,
}

async fn setup(provider: Provider, tweak: impl FnOnce(&mut ModelConfig)) -> Setup {
    let server = MockServer::start().await;
    let sleeper = Arc::new(RecordingSleeper::default());
    let mut config = ModelConfig {
        provider,
        model: "test-model".into(),
        ..ModelConfig::default()
    };
    tweak(&mut config);
    let openai_base = format!("{}/v1", server.uri());
    let env = MapEnv::new([
        ("OPENAI_BASE_URL", openai_base.as_str()),
        ("OPENAI_API_KEY", "sk-test-key"),
        ("ANTHROPIC_BASE_URL", server.uri().as_str()),
        ("ANTHROPIC_API_KEY", "ant-test-key"),
    ]);
    let deps = AdapterDeps {
        sleeper: sleeper.clone(),
        seed: Some(42),
    };
    let model = config.build_with(&env, &deps).unwrap();
    Setup {
        server,
        sleeper,
        model,
    }
}

fn json_response(body: &Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(body)
}

async fn sent_bodies(server: &MockServer) -> Vec<Value> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

/// The reply as the service answers it on the wire.
fn answered(reply: &ModelReply) -> Outcome {
    let response = agentloop_proto::v1::DecideResponse::from(reply.clone());
    response.outcome.expect("a reply always has an outcome")
}

fn calls_of(reply: &ModelReply) -> Vec<ToolCall> {
    match &answered(reply) {
        Outcome::Decision(Decision {
            kind: Some(Kind::ToolCalls(ToolCalls { calls })),
        }) => calls.clone(),
        other => panic!("expected tool calls, got {other:?}"),
    }
}

fn kind_of(reply: &ModelReply) -> Kind {
    match &answered(reply) {
        Outcome::Decision(Decision { kind: Some(kind) }) => kind.clone(),
        other => panic!("expected a decision, got {other:?}"),
    }
}

fn invalid_of(reply: &ModelReply) -> (String, String) {
    match &answered(reply) {
        Outcome::Invalid(invalid) => (invalid.reason.clone(), invalid.raw.clone()),
        other => panic!("expected invalid output, got {other:?}"),
    }
}

fn openai_tool_calls_body(calls: &[(Option<&str>, &str, &str)], content: Value) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, args)| {
            let mut call =
                json!({"type": "function", "function": {"name": name, "arguments": args}});
            if let Some(id) = id {
                call["id"] = json!(id);
            }
            call
        })
        .collect();
    json!({
        "id": "chatcmpl-AbC123",
        "object": "chat.completion",
        "created": 1_727_000_000,
        "model": "gpt-4o-2024-08-06",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "tool_calls": tool_calls, "refusal": null},
            "logprobs": null,
            "finish_reason": "tool_calls"
        }],
        "usage": {"prompt_tokens": 123, "completion_tokens": 45, "total_tokens": 168},
        "system_fingerprint": "fp_abc"
    })
}

fn openai_text_body(content: Value, finish: &str, refusal: Value) -> Value {
    json!({
        "id": "chatcmpl-Txt",
        "object": "chat.completion",
        "created": 1_727_000_000,
        "model": "gpt-4o-2024-08-06",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": refusal},
            "logprobs": null,
            "finish_reason": finish
        }],
        "usage": {"prompt_tokens": 80, "completion_tokens": 12, "total_tokens": 92}
    })
}

// ---------------------------------------------------------------- OpenAI

#[tokio::test]
async fn openai_parallel_tool_calls_and_the_request_it_sent() {
    let s = setup(Provider::Openai, |_| {}).await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", "Bearer sk-test-key"))
        .respond_with(json_response(&openai_tool_calls_body(
            &[
                (
                    Some("call_Q1"),
                    "lookup_customer",
                    r#"{"customer_id":"C-42"}"#,
                ),
                (
                    Some("call_Q2"),
                    "get_policy",
                    r#"{"topic": "refund",  "n": 12345678901234567890123}"#,
                ),
            ],
            Value::Null,
        )))
        .expect(1)
        .mount(&s.server)
        .await;
    let reply = s.model.decide(&request()).await.unwrap();
    let calls = calls_of(&reply);
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[0],
        call("call_Q1", "lookup_customer", r#"{"customer_id":"C-42"}"#)
    );
    // Arguments stay the provider's text: big numbers and spacing survive.
    assert_eq!(
        calls[1].arguments_json,
        r#"{"topic": "refund",  "n": 12345678901234567890123}"#
    );
    assert_eq!(
        (reply.usage.input_tokens, reply.usage.output_tokens),
        (123, 45)
    );
    assert_eq!(reply.model, "gpt-4o-2024-08-06");
    assert_eq!(reply.response_id, "chatcmpl-AbC123");

    let body = &sent_bodies(&s.server).await[0];
    assert_eq!(body["model"], "test-model");
    assert!(body.get("max_tokens").is_none());
    let tools = body["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 2);
    assert_eq!(tools[0]["type"], "function");
    assert_eq!(tools[0]["function"]["name"], "lookup_customer");
    assert_eq!(
        tools[0]["function"]["parameters"],
        serde_json::from_str::<Value>(CUSTOMER_SCHEMA).unwrap()
    );
    let messages = body["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        [
            "system",
            "user",
            "assistant",
            "tool",
            "tool",
            "assistant",
            "user"
        ]
    );
    assert!(
        messages[1]["content"]
            .as_str()
            .unwrap()
            .contains("customer C-42")
    );
    let ids: Vec<&str> = messages[2]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["call_a", "call_b"]);
    assert_eq!(
        messages[2]["tool_calls"][0]["function"]["arguments"],
        r#"{"customer_id":"C-42"}"#
    );
    assert_eq!(messages[3]["tool_call_id"], "call_a");
    assert_eq!(messages[3]["content"], r#"{"id":"C-42","tier":"gold"}"#);
    assert_eq!(messages[4]["tool_call_id"], "call_b");
    assert!(
        messages[4]["content"]
            .as_str()
            .unwrap()
            .contains("ERROR_TYPE_NOT_FOUND")
    );
    // The rejected answer comes back with what it cited.
    assert_eq!(messages[5]["content"], "Gold.\nEvidence: call_a");
    assert!(
        messages[6]["content"]
            .as_str()
            .unwrap()
            .contains("the answer must cite the policy")
    );
}

#[tokio::test]
async fn openai_text_with_tool_calls_and_untrusted_ids() {
    let s = setup(Provider::Openai, |_| {}).await;
    Mock::given(method("POST"))
        .respond_with(json_response(&openai_tool_calls_body(
            &[
                (Some("dup"), "lookup_customer", r#"{"customer_id":"C-1"}"#),
                (Some("dup"), "lookup_customer", r#"{"customer_id":"C-2"}"#),
                (None, "get_policy", ""),
                (Some("call_a"), "get_policy", "{}"),
                (Some("fresh"), "get_policy", "{}"),
            ],
            json!("Let me look these up first."),
        )))
        .mount(&s.server)
        .await;
    let calls = calls_of(&s.model.decide(&request()).await.unwrap());
    let ids: Vec<&str> = calls.iter().map(|c| c.call_id.as_str()).collect();
    // Repeated, missing and already-used (call_a is in the history) IDs are replaced.
    assert_eq!(
        ids,
        ["call-3-0", "call-3-1", "call-3-2", "call-3-3", "fresh"]
    );
    assert_eq!(calls[2].arguments_json, "{}");
}

#[tokio::test]
async fn openai_finish_reasons_and_refusals() {
    let s = setup(Provider::Openai, |_| {}).await;
    let bodies = [
        openai_text_body(
            json!("Customer C-42 is gold; refunds within 30 days."),
            "stop",
            Value::Null,
        ),
        openai_text_body(Value::Null, "stop", json!("I can't help with that.")),
        openai_text_body(Value::Null, "content_filter", Value::Null),
        openai_text_body(json!("The answer is cut"), "length", Value::Null),
        openai_text_body(json!(""), "stop", Value::Null),
    ];
    for body in &bodies {
        Mock::given(method("POST"))
            .respond_with(json_response(body))
            .up_to_n_times(1)
            .mount(&s.server)
            .await;
    }
    let first = s.model.decide(&request()).await.unwrap();
    assert_eq!(
        kind_of(&first),
        Kind::Final(agentloop_proto::v1::decision::Final {
            answer: "Customer C-42 is gold; refunds within 30 days.".into(),
            evidence: Vec::new(),
        })
    );
    assert_eq!(
        (first.usage.input_tokens, first.usage.output_tokens),
        (80, 12)
    );
    match kind_of(&s.model.decide(&request()).await.unwrap()) {
        Kind::CannotContinue(c) => assert_eq!(c.reason, "I can't help with that."),
        other => panic!("{other:?}"),
    }
    match kind_of(&s.model.decide(&request()).await.unwrap()) {
        Kind::CannotContinue(c) => assert!(c.reason.contains("content filter")),
        other => panic!("{other:?}"),
    }
    let (reason, raw) = invalid_of(&s.model.decide(&request()).await.unwrap());
    assert!(reason.contains("max_tokens"), "{reason}");
    assert_eq!(raw, "The answer is cut");
    let (reason, _) = invalid_of(&s.model.decide(&request()).await.unwrap());
    assert!(reason.contains("no tool call and no text"), "{reason}");
}

#[tokio::test]
async fn openai_malformed_tool_arguments_are_invalid_output() {
    let s = setup(Provider::Openai, |_| {}).await;
    Mock::given(method("POST"))
        .respond_with(json_response(&openai_tool_calls_body(
            &[
                (Some("c1"), "lookup_customer", r#"{"customer_id":"C-42"}"#),
                (Some("c2"), "get_policy", r#"{"topic": "refu"#),
            ],
            Value::Null,
        )))
        .mount(&s.server)
        .await;
    let reply = s.model.decide(&request()).await.unwrap();
    let (reason, raw) = invalid_of(&reply);
    assert!(
        reason.contains("tool call 1 (get_policy)") && reason.contains("not valid JSON"),
        "{reason}"
    );
    assert_eq!(raw, r#"{"topic": "refu"#);
    assert_eq!(
        reply.usage.output_tokens, 45,
        "usage is kept for invalid output"
    );
    assert!(
        s.sleeper.delays().is_empty(),
        "invalid output is not retried"
    );
}

#[tokio::test]
async fn openai_429_with_retry_after_then_success() {
    let s = setup(Provider::Openai, |_| {}).await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("retry-after", "2")
                .set_body_json(json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}})),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&s.server)
        .await;
    Mock::given(method("POST"))
        .respond_with(json_response(&openai_text_body(
            json!("done"),
            "stop",
            Value::Null,
        )))
        .mount(&s.server)
        .await;
    let reply = s.model.decide(&request()).await.unwrap();
    assert!(matches!(kind_of(&reply), Kind::Final(_)));
    assert_eq!(s.sleeper.delays(), [Duration::from_secs(2)]);
    let bodies = sent_bodies(&s.server).await;
    assert_eq!(bodies.len(), 2);
    assert_eq!(bodies[0], bodies[1], "the retry sends the same request");
}

#[tokio::test]
async fn retry_after_is_capped() {
    let s = setup(Provider::Openai, |c| c.max_retry_after_ms = 1500).await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "3600"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&s.server)
        .await;
    Mock::given(method("POST"))
        .respond_with(json_response(&openai_text_body(
            json!("done"),
            "stop",
            Value::Null,
        )))
        .mount(&s.server)
        .await;
    s.model.decide(&request()).await.unwrap();
    assert_eq!(s.sleeper.delays(), [Duration::from_millis(1500)]);
}

#[tokio::test]
async fn openai_500_then_success_backs_off_with_jitter() {
    let s = setup(Provider::Openai, |_| {}).await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500).set_body_string("upstream exploded"))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&s.server)
        .await;
    Mock::given(method("POST"))
        .respond_with(json_response(&openai_text_body(
            json!("done"),
            "stop",
            Value::Null,
        )))
        .mount(&s.server)
        .await;
    s.model.decide(&request()).await.unwrap();
    let delays = s.sleeper.delays();
    assert_eq!(delays.len(), 2);
    assert!(
        (Duration::from_millis(250)..=Duration::from_millis(500)).contains(&delays[0]),
        "{delays:?}"
    );
    assert!(
        (Duration::from_millis(500)..=Duration::from_millis(1000)).contains(&delays[1]),
        "{delays:?}"
    );
}

#[tokio::test]
async fn openai_500_forever_fails_with_the_status_kept() {
    let s = setup(Provider::Openai, |c| c.max_retries = 2).await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_body_string("overloaded"))
        .expect(3)
        .mount(&s.server)
        .await;
    let error = s.model.decide(&request()).await.unwrap_err();
    let ModelError::Provider(message) = &error else {
        panic!("{error:?}")
    };
    assert!(
        message.contains("HTTP 503")
            && message.contains("overloaded")
            && message.contains("3 attempts"),
        "{message}"
    );
    assert_eq!(s.sleeper.delays().len(), 2);
    let status = tonic::Status::from(error);
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().contains("HTTP 503"));
}

#[tokio::test]
async fn client_errors_other_than_429_are_not_retried() {
    let s = setup(Provider::Openai, |_| {}).await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(401)
                .set_body_json(json!({"error": {"message": "Incorrect API key provided"}})),
        )
        .expect(1)
        .mount(&s.server)
        .await;
    let error = s.model.decide(&request()).await.unwrap_err();
    assert!(error.to_string().contains("HTTP 401"), "{error}");
    assert!(!error.to_string().contains("sk-test-key"));
    assert!(s.sleeper.delays().is_empty());
}

#[tokio::test]
async fn a_truncated_body_is_retried_then_fails() {
    let s = setup(Provider::Openai, |c| c.max_retries = 1).await;
    let full = openai_text_body(json!("done"), "stop", Value::Null).to_string();
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_raw(full[..full.len() / 2].to_owned(), "application/json"),
        )
        .expect(2)
        .mount(&s.server)
        .await;
    let error = s.model.decide(&request()).await.unwrap_err();
    assert!(
        error.to_string().contains("HTTP 200") && error.to_string().contains("not complete JSON"),
        "{error}"
    );
    assert_eq!(s.sleeper.delays().len(), 1);
}

#[tokio::test]
async fn a_connection_cut_mid_body_is_retried_then_fails() {
    // A raw server that promises 1000 bytes, sends 40 and hangs up.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut socket, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = vec![0u8; 64 * 1024];
            let _ = socket.read(&mut buf).await;
            let _ = socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"id\":\"chatcmpl-1\",\"choices\":[{\"mess")
                .await;
            let _ = socket.shutdown().await;
        }
    });
    let sleeper = Arc::new(RecordingSleeper::default());
    let base = format!("http://{addr}/v1");
    let model = ModelConfig {
        max_retries: 2,
        ..ModelConfig::from_spec("openai:m").unwrap()
    }
    .build_with(
        &MapEnv::new([("OPENAI_BASE_URL", base.as_str())]),
        &AdapterDeps {
            sleeper: sleeper.clone(),
            seed: Some(1),
        },
    )
    .unwrap();
    let error = model.decide(&request()).await.unwrap_err();
    assert!(error.to_string().contains("3 attempts"), "{error}");
    assert_eq!(sleeper.delays().len(), 2);
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_timeout_is_retried_then_fails() {
    let s = setup(Provider::Openai, |c| {
        c.timeout_ms = 100;
        c.max_retries = 1;
    })
    .await;
    Mock::given(method("POST"))
        .respond_with(
            json_response(&openai_text_body(json!("late"), "stop", Value::Null))
                .set_delay(Duration::from_secs(5)),
        )
        .mount(&s.server)
        .await;
    let error = s.model.decide(&request()).await.unwrap_err();
    assert!(
        error.to_string().contains("timeout") || error.to_string().contains("timed out"),
        "{error}"
    );
    assert_eq!(s.sleeper.delays().len(), 1);
}

#[tokio::test]
async fn the_window_keeps_the_goal_and_the_last_turns_and_elides_older_ones() {
    let s = setup(Provider::Openai, |c| {
        c.keep_last_turns = 2;
        c.max_tokens = Some(256);
    })
    .await;
    Mock::given(method("POST"))
        .respond_with(json_response(&openai_text_body(
            json!("done"),
            "stop",
            Value::Null,
        )))
        .mount(&s.server)
        .await;
    let mut req = request();
    req.turn = 101;
    req.context_from_seq = 85;
    req.summary = "84 turns of lookups".into();
    req.history = (85..101)
        .map(|t| {
            let id = format!("call-{t}-0");
            turn_event(
                u64::from(t),
                calls_turn(
                    t,
                    vec![call(&id, "lookup_customer", "{}")],
                    vec![output(&id, "{}")],
                ),
            )
        })
        .collect();
    s.model.decide(&req).await.unwrap();
    let body = &sent_bodies(&s.server).await[0];
    assert_eq!(body["max_tokens"], 256);
    let messages = body["messages"].as_array().unwrap();
    assert!(
        messages[1]["content"]
            .as_str()
            .unwrap()
            .contains("customer C-42"),
        "the goal is kept"
    );
    assert!(
        messages[2]["content"]
            .as_str()
            .unwrap()
            .contains("84 turns of lookups")
    );
    let elided = messages[3]["content"].as_str().unwrap();
    assert!(
        elided.starts_with("[Older turns, elided: turn 85: called lookup_customer"),
        "{elided}"
    );
    assert!(elided.contains("turn 98:") && !elided.contains("turn 99:"));
    let full: Vec<&str> = messages
        .iter()
        .filter_map(|m| m["tool_calls"][0]["id"].as_str())
        .collect();
    assert_eq!(full, ["call-99-0", "call-100-0"]);
    assert_eq!(messages.len(), 4 + 2 * 2);
}

// ---------------------------------------------------------------- Anthropic

fn anthropic_body(content: Value, stop: &str) -> Value {
    json!({
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": {"input_tokens": 200, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 10, "output_tokens": 60}
    })
}

#[tokio::test]
async fn anthropic_text_and_parallel_tool_use_and_the_request_it_sent() {
    let s = setup(Provider::Anthropic, |_| {}).await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(header("x-api-key", "ant-test-key"))
        .and(header("anthropic-version", "2023-06-01"))
        .respond_with(json_response(&anthropic_body(
            json!([
                {"type": "text", "text": "I'll look up both."},
                {"type": "tool_use", "id": "toolu_01A", "name": "lookup_customer", "input": {"customer_id": "C-42"}},
                {"type": "tool_use", "id": "toolu_01B", "name": "get_policy", "input": {"topic": "refunds"}}
            ]),
            "tool_use",
        )))
        .expect(1)
        .mount(&s.server)
        .await;
    let reply = s.model.decide(&request()).await.unwrap();
    let calls = calls_of(&reply);
    assert_eq!(
        calls[0],
        call("toolu_01A", "lookup_customer", r#"{"customer_id":"C-42"}"#)
    );
    assert_eq!(
        calls[1],
        call("toolu_01B", "get_policy", r#"{"topic":"refunds"}"#)
    );
    assert_eq!(
        (reply.usage.input_tokens, reply.usage.output_tokens),
        (210, 60)
    );
    assert_eq!(reply.response_id, "msg_01XFDUDYJgAACzvnptvVoYEL");

    let body = &sent_bodies(&s.server).await[0];
    assert_eq!(body["max_tokens"], 4096);
    assert!(body["system"].as_str().unwrap().contains("agent"));
    assert_eq!(body["tools"][0]["name"], "lookup_customer");
    assert_eq!(
        body["tools"][0]["input_schema"],
        serde_json::from_str::<Value>(CUSTOMER_SCHEMA).unwrap()
    );
    let messages = body["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "user", "assistant", "user"],
        "roles alternate"
    );
    let uses = messages[1]["content"].as_array().unwrap();
    assert_eq!(uses[0]["type"], "tool_use");
    assert_eq!(uses[0]["id"], "call_a");
    assert_eq!(uses[0]["input"], json!({"customer_id": "C-42"}));
    let results = messages[2]["content"].as_array().unwrap();
    assert_eq!(results[0]["type"], "tool_result");
    assert_eq!(results[0]["tool_use_id"], "call_a");
    assert_eq!(results[0]["is_error"], false);
    assert_eq!(results[1]["tool_use_id"], "call_b");
    assert_eq!(results[1]["is_error"], true);
    assert_eq!(messages[3]["content"][0]["text"], "Gold.\nEvidence: call_a");
    assert!(
        messages[4]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("cite the policy")
    );
}

#[tokio::test]
async fn anthropic_stop_reasons_refusal_and_malformed_input() {
    let s = setup(Provider::Anthropic, |_| {}).await;
    let bodies = [
        anthropic_body(
            json!([{"type": "text", "text": "C-42 is gold."}]),
            "end_turn",
        ),
        anthropic_body(json!([]), "refusal"),
        anthropic_body(json!([{"type": "text", "text": "Partial"}]), "max_tokens"),
        anthropic_body(
            json!([{"type": "tool_use", "id": "toolu_1", "name": "get_policy", "input": "{\"topic\": "}]),
            "tool_use",
        ),
    ];
    for body in &bodies {
        Mock::given(method("POST"))
            .respond_with(json_response(body))
            .up_to_n_times(1)
            .mount(&s.server)
            .await;
    }
    match kind_of(&s.model.decide(&request()).await.unwrap()) {
        Kind::Final(f) => assert_eq!(f.answer, "C-42 is gold."),
        other => panic!("{other:?}"),
    }
    match kind_of(&s.model.decide(&request()).await.unwrap()) {
        Kind::CannotContinue(c) => assert_eq!(c.reason, "the model refused"),
        other => panic!("{other:?}"),
    }
    let (reason, _) = invalid_of(&s.model.decide(&request()).await.unwrap());
    assert!(reason.contains("max_tokens"));
    let (reason, raw) = invalid_of(&s.model.decide(&request()).await.unwrap());
    assert!(reason.contains("not valid JSON"), "{reason}");
    assert_eq!(raw, "{\"topic\": ");
}

#[tokio::test]
async fn anthropic_overloaded_then_success() {
    let s = setup(Provider::Anthropic, |_| {}).await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(529).set_body_json(json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&s.server)
        .await;
    Mock::given(method("POST"))
        .respond_with(json_response(&anthropic_body(
            json!([{"type": "text", "text": "ok"}]),
            "end_turn",
        )))
        .mount(&s.server)
        .await;
    assert!(matches!(
        kind_of(&s.model.decide(&request()).await.unwrap()),
        Kind::Final(_)
    ));
    assert_eq!(s.sleeper.delays().len(), 1);
}

// ---------------------------------------------------------------- citations

fn final_of(reply: &ModelReply) -> agentloop_proto::v1::decision::Final {
    match kind_of(reply) {
        Kind::Final(f) => f,
        other => panic!("expected a final answer, got {other:?}"),
    }
}

/// The system prompt asks for the closing line in the form the parser reads.
fn asks_for_evidence(system: &str) {
    assert!(
        system.contains("`Evidence: <call IDs, comma-separated>`")
            && system.contains("`Evidence: none`"),
        "{system}"
    );
}

#[tokio::test]
async fn openai_answers_cite_their_calls_on_the_evidence_line() {
    let s = setup(Provider::Openai, |_| {}).await;
    let bodies = [
        openai_text_body(
            json!("C-42 is gold; no refund policy was found.\n\n**Evidence:** call_1, `call_a`"),
            "stop",
            Value::Null,
        ),
        openai_text_body(json!("C-42 is gold."), "stop", Value::Null),
        openai_text_body(json!("C-42 is gold.\nEvidence: none"), "stop", Value::Null),
        openai_text_body(json!("Evidence: call_1\n"), "stop", Value::Null),
    ];
    for body in &bodies {
        Mock::given(method("POST"))
            .respond_with(json_response(body))
            .up_to_n_times(1)
            .mount(&s.server)
            .await;
    }
    let cited = final_of(&s.model.decide(&request()).await.unwrap());
    assert_eq!(cited.answer, "C-42 is gold; no refund policy was found.");
    assert_eq!(cited.evidence, ["call_1", "call_a"]);
    let plain = final_of(&s.model.decide(&request()).await.unwrap());
    assert_eq!(plain.answer, "C-42 is gold.");
    assert!(plain.evidence.is_empty());
    let none = final_of(&s.model.decide(&request()).await.unwrap());
    assert_eq!(none.answer, "C-42 is gold.");
    assert!(none.evidence.is_empty());
    let (reason, raw) = invalid_of(&s.model.decide(&request()).await.unwrap());
    assert!(reason.contains("no tool call and no text"), "{reason}");
    assert_eq!(raw, "Evidence: call_1\n");

    let body = &sent_bodies(&s.server).await[0];
    assert_eq!(body["messages"][0]["role"], "system");
    asks_for_evidence(body["messages"][0]["content"].as_str().unwrap());
}

#[tokio::test]
async fn anthropic_answers_cite_their_calls_on_the_evidence_line() {
    let s = setup(Provider::Anthropic, |_| {}).await;
    let bodies = [
        anthropic_body(
            json!([
                {"type": "text", "text": "C-42 is gold.\n"},
                {"type": "text", "text": "evidence: toolu_01, toolu_02 toolu_01\n"}
            ]),
            "end_turn",
        ),
        anthropic_body(
            json!([{"type": "text", "text": "C-42 is gold."}]),
            "end_turn",
        ),
        anthropic_body(
            json!([{"type": "text", "text": "**Evidence:** toolu_01"}]),
            "end_turn",
        ),
    ];
    for body in &bodies {
        Mock::given(method("POST"))
            .respond_with(json_response(body))
            .up_to_n_times(1)
            .mount(&s.server)
            .await;
    }
    let cited = final_of(&s.model.decide(&request()).await.unwrap());
    assert_eq!(cited.answer, "C-42 is gold.");
    assert_eq!(cited.evidence, ["toolu_01", "toolu_02"]);
    let plain = final_of(&s.model.decide(&request()).await.unwrap());
    assert_eq!(plain.answer, "C-42 is gold.");
    assert!(plain.evidence.is_empty());
    let (reason, raw) = invalid_of(&s.model.decide(&request()).await.unwrap());
    assert!(reason.contains("no tool call and no text"), "{reason}");
    assert_eq!(raw, "**Evidence:** toolu_01");

    let body = &sent_bodies(&s.server).await[0];
    asks_for_evidence(body["system"].as_str().unwrap());
}

#[test]
fn a_configured_system_prompt_still_asks_for_the_evidence_line() {
    let request = request();
    let config = |spec: &str| ModelConfig {
        system_prompt: Some("You answer tersely.".into()),
        ..ModelConfig::from_spec(spec).unwrap()
    };
    let env = MapEnv::new([("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")]);
    let deps = AdapterDeps::default();
    let openai = OpenAiModel::from_config(&config("openai:m"), &env, &deps)
        .unwrap()
        .request_body(&Question::from(&request), &request.tools);
    let anthropic = AnthropicModel::from_config(&config("anthropic:m"), &env, &deps)
        .unwrap()
        .request_body(&Question::from(&request), &request.tools);
    for system in [&openai["messages"][0]["content"], &anthropic["system"]] {
        let system = system.as_str().unwrap();
        assert!(system.starts_with("You answer tersely."), "{system}");
        assert!(!system.contains("You are an agent"), "{system}");
        asks_for_evidence(system);
    }
}

/// A tool the gateway lists unavailable is still offered (its calls are planned against
/// its schema), but both providers' models read that its calls fail until it is back;
/// the others read their descriptions unchanged.
#[test]
fn the_model_is_told_which_tools_are_unavailable() {
    let mut request = request();
    request.tools[1].unavailable = true;
    let env = MapEnv::new([("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")]);
    let deps = AdapterDeps::default();
    let spec = |spec: &str| ModelConfig::from_spec(spec).unwrap();
    let openai = OpenAiModel::from_config(&spec("openai:m"), &env, &deps)
        .unwrap()
        .request_body(&Question::from(&request), &request.tools);
    let anthropic = AnthropicModel::from_config(&spec("anthropic:m"), &env, &deps)
        .unwrap()
        .request_body(&Question::from(&request), &request.tools);
    let descriptions = [
        (
            &openai["tools"][0]["function"]["description"],
            &openai["tools"][1]["function"]["description"],
        ),
        (
            &anthropic["tools"][0]["description"],
            &anthropic["tools"][1]["description"],
        ),
    ];
    for (available, unavailable) in descriptions {
        assert_eq!(available, "Looks a customer up by ID");
        let unavailable = unavailable.as_str().unwrap();
        assert!(unavailable.starts_with("Reads a policy"), "{unavailable}");
        assert!(
            unavailable.contains("Unavailable right now"),
            "{unavailable}"
        );
    }
}

// ---------------------------------------------------------------- configuration

#[tokio::test]
async fn profiles_route_to_their_models_and_others_to_the_default() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(json_response(&openai_text_body(
            json!("from openai"),
            "stop",
            Value::Null,
        )))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(header("x-api-key", "team-key"))
        .respond_with(json_response(&anthropic_body(
            json!([{"type": "text", "text": "from anthropic"}]),
            "end_turn",
        )))
        .mount(&server)
        .await;
    let config: DecisionConfig = toml::from_str(&format!(
        r#"
        [model]
        provider = "openai"
        model = "qwen2.5"
        base_url = "{uri}/v1"

        [profiles.careful.model]
        provider = "anthropic"
        model = "claude-sonnet-4-5"
        base_url = "{uri}"
        api_key_env = "TEAM_KEY"
        max_tokens = 1024
        "#,
        uri = server.uri()
    ))
    .unwrap();
    let env = MapEnv::new([("TEAM_KEY", "team-key")]);
    let decision =
        DecisionServer::from_config_with(&config, &env, &AdapterDeps::default()).unwrap();
    let mut req = request();
    match kind_of(&decision.decide(&req).await.unwrap()) {
        Kind::Final(f) => assert_eq!(f.answer, "from openai"),
        other => panic!("{other:?}"),
    }
    req.profile = "careful".into();
    match kind_of(&decision.decide(&req).await.unwrap()) {
        Kind::Final(f) => assert_eq!(f.answer, "from anthropic"),
        other => panic!("{other:?}"),
    }
    let missing =
        DecisionServer::from_config_with(&config, &MapEnv::default(), &AdapterDeps::default())
            .unwrap_err();
    assert!(
        missing.to_string().contains("profile careful") && missing.to_string().contains("TEAM_KEY"),
        "{missing}"
    );
    // A script in the request still wins over the configured model.
    req.scripted_model_json = r#"{"turns": [{"final": "scripted"}], "repeat_last": true}"#.into();
    match kind_of(&decision.decide(&req).await.unwrap()) {
        Kind::Final(f) => assert_eq!(f.answer, "scripted"),
        other => panic!("{other:?}"),
    }
}

/// The tools given apart from the request are the ones offered to the model, and the
/// request's own are not read: an orchestrator in the same process shares one list of
/// tools among its invocations instead of a copy in each request.
#[tokio::test]
async fn the_tools_given_apart_from_the_request_are_the_ones_offered() {
    let s = setup(Provider::Openai, |_| {}).await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(json_response(&openai_text_body(
            json!("done"),
            "stop",
            Value::Null,
        )))
        .expect(2)
        .mount(&s.server)
        .await;
    let decision = DecisionServer::new(Some(s.model.clone()));
    let mut bare = request();
    bare.tools.clear();
    decision.decide_with(&bare, &tools()).await.unwrap();
    decision.decide_with(&request(), &[]).await.unwrap();
    let bodies = sent_bodies(&s.server).await;
    let offered: Vec<&Value> = bodies[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| &tool["function"]["name"])
        .collect();
    assert_eq!(offered, [&json!("lookup_customer"), &json!("get_policy")]);
    assert!(bodies[1].get("tools").is_none(), "{}", bodies[1]);
}

// ---------------------------------------------------------------- bounded context

/// The prompt depends on a bounded suffix of the history only: a request that carries
/// all 999 earlier turns gives exactly the body of one that carries the last
/// `MAX_HISTORY_EVENTS`, for both adapters. So no work in the adapter grows with the
/// invocation, whatever the caller sends (the context bench measures the time).
#[tokio::test]
async fn a_prompt_reads_only_a_bounded_suffix_of_the_history() {
    let history: Vec<Event> = (1..1000u32)
        .map(|t| {
            let id = format!("call-{t}");
            let args = format!(r#"{{"customer_id":"C-{t}"}}"#);
            let result = output(&id, r#"{"tier":"gold"}"#);
            turn_event(
                u64::from(t),
                calls_turn(t, vec![call(&id, "lookup_customer", &args)], vec![result]),
            )
        })
        .collect();
    let whole = DecideRequest {
        turn: 1000,
        history: history.clone(),
        context_from_seq: 1,
        ..request()
    };
    let tail = history[history.len() - MAX_HISTORY_EVENTS..].to_vec();
    let suffix = DecideRequest {
        context_from_seq: tail[0].seq,
        history: tail,
        ..whole.clone()
    };
    let env = MapEnv::new([("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")]);
    let deps = AdapterDeps::default();
    let openai =
        OpenAiModel::from_config(&ModelConfig::from_spec("openai:m").unwrap(), &env, &deps)
            .unwrap();
    let anthropic =
        AnthropicModel::from_config(&ModelConfig::from_spec("anthropic:m").unwrap(), &env, &deps)
            .unwrap();
    assert_eq!(
        openai.request_body(&Question::from(&whole), &whole.tools),
        openai.request_body(&Question::from(&suffix), &suffix.tools)
    );
    assert_eq!(
        anthropic.request_body(&Question::from(&whole), &whole.tools),
        anthropic.request_body(&Question::from(&suffix), &suffix.tools)
    );
    // And the window is what the config keeps: the last turns in full, the rest noted.
    let body = anthropic
        .request_body(&Question::from(&whole), &whole.tools)
        .to_string();
    assert!(body.contains("call-999") && !body.contains(r#""call-900""#));
}

// ---------------------------------------------------------------- prices

/// A mock that answers both APIs: OpenAI with 80 prompt / 12 completion tokens,
/// Anthropic with 200 + 10 cached input / 60 output tokens.
async fn both_apis() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(json_response(&openai_text_body(
            json!("from openai"),
            "stop",
            Value::Null,
        )))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .respond_with(json_response(&anthropic_body(
            json!([{"type": "text", "text": "from anthropic"}]),
            "end_turn",
        )))
        .mount(&server)
        .await;
    server
}

async fn cost_for(decision: &DecisionServer, profile: &str) -> (String, Option<u64>) {
    let mut req = request();
    req.profile = profile.into();
    let reply = decision.decide(&req).await.unwrap();
    (reply.model, reply.usage.cost.map(|cost| cost.0))
}

#[tokio::test]
async fn each_reply_costs_its_usage_at_the_price_of_its_configured_model() {
    let server = both_apis().await;
    let config: DecisionConfig = toml::from_str(&format!(
        r#"
        [model]
        provider = "openai"
        model = "gpt-4o"
        base_url = "{uri}/v1"

        [profiles.careful.model]
        provider = "anthropic"
        model = "claude-sonnet-4-5"
        base_url = "{uri}"

        [profiles.local.model]
        provider = "openai"
        model = "qwen2.5"
        base_url = "{uri}/v1"

        [prices."gpt-4o"]
        input_usd_per_mtok = 2.50
        output_usd_per_mtok = 10

        [prices.claude-sonnet-4-5]
        input_usd_per_mtok = "3.00"
        output_usd_per_mtok = 15
        "#,
        uri = server.uri()
    ))
    .unwrap();
    let decision =
        DecisionServer::from_config_with(&config, &MapEnv::default(), &AdapterDeps::default())
            .unwrap();
    // 80 in at $2.50/M + 12 out at $10/M = 200 + 120 µ$. The provider answers as a dated
    // snapshot; the price is the configured model's.
    assert_eq!(
        cost_for(&decision, "default").await,
        ("gpt-4o-2024-08-06".into(), Some(320))
    );
    // Cached input counts as input: 210 in at $3/M + 60 out at $15/M = 630 + 900 µ$.
    assert_eq!(
        cost_for(&decision, "careful").await,
        ("claude-sonnet-4-5-20250929".into(), Some(1_530))
    );
    // No price entry: no cost at all, which is not a cost of zero.
    assert_eq!(
        cost_for(&decision, "local").await,
        ("gpt-4o-2024-08-06".into(), None)
    );
}

/// The decision service's flags when none are given (as `main` passes them).
#[derive(Debug, Default, serde::Serialize)]
struct NoFlags {}

#[tokio::test]
async fn nested_model_profiles_and_prices_load_from_environment_variables() {
    let server = both_apis().await;
    let uri = server.uri();
    let vars = [
        ("AGENTLOOP_DECISION_MODEL__PROVIDER", "openai".to_owned()),
        ("AGENTLOOP_DECISION_MODEL__MODEL", "gpt-4o".to_owned()),
        ("AGENTLOOP_DECISION_MODEL__BASE_URL", format!("{uri}/v1")),
        ("AGENTLOOP_DECISION_MODEL__MAX_RETRIES", "0".to_owned()),
        (
            "agentloop_decision_profiles__careful__model__provider",
            "anthropic".to_owned(),
        ),
        (
            "AGENTLOOP_DECISION_PROFILES__CAREFUL__MODEL__MODEL",
            "claude-sonnet-4-5".to_owned(),
        ),
        (
            "AGENTLOOP_DECISION_PROFILES__CAREFUL__MODEL__BASE_URL",
            uri.clone(),
        ),
        (
            "AGENTLOOP_DECISION_PROFILES__CAREFUL__MODEL__API_KEY_ENV",
            "TEAM_KEY".to_owned(),
        ),
        (
            "AGENTLOOP_DECISION_PRICES__GPT-4O__INPUT_USD_PER_MTOK",
            "2.50".to_owned(),
        ),
        (
            "AGENTLOOP_DECISION_PRICES__GPT-4O__OUTPUT_USD_PER_MTOK",
            "10".to_owned(),
        ),
        ("OTHER_SERVICE_MODEL__PROVIDER", "anthropic".to_owned()),
    ];
    let env = vars.iter().map(|(k, v)| ((*k).to_owned(), v.clone()));
    let from_env: DecisionConfig =
        agentloop_server::config::load_from(None, env, "AGENTLOOP_DECISION_", NoFlags {}).unwrap();
    // The file through the same layers (defaults under it), as a service reads it.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("decision.toml");
    std::fs::write(
        &file,
        format!(
            r#"
        [model]
        provider = "openai"
        model = "gpt-4o"
        base_url = "{uri}/v1"
        max_retries = 0

        [profiles.careful.model]
        provider = "anthropic"
        model = "claude-sonnet-4-5"
        base_url = "{uri}"
        api_key_env = "TEAM_KEY"

        [prices."gpt-4o"]
        input_usd_per_mtok = 2.5
        output_usd_per_mtok = 10
        "#
        ),
    )
    .unwrap();
    let from_file: DecisionConfig = agentloop_server::config::load_from(
        Some(&file),
        Vec::<(String, String)>::new(),
        "AGENTLOOP_DECISION_",
        NoFlags {},
    )
    .unwrap();
    assert_eq!(from_env, from_file);

    // And the loaded configuration works: each profile reaches its provider, priced.
    let keys = MapEnv::new([("TEAM_KEY", "team-key")]);
    let decision =
        DecisionServer::from_config_with(&from_env, &keys, &AdapterDeps::default()).unwrap();
    assert_eq!(cost_for(&decision, "default").await.1, Some(320));
    assert_eq!(
        cost_for(&decision, "careful").await,
        ("claude-sonnet-4-5-20250929".into(), None)
    );
    let sent = server.received_requests().await.unwrap();
    assert_eq!(
        sent.iter().map(|r| r.url.path()).collect::<Vec<_>>(),
        ["/v1/chat/completions", "/v1/messages"]
    );
    assert_eq!(
        sent[1].headers.get("x-api-key").unwrap().to_str().unwrap(),
        "team-key"
    );

    // A malformed price is refused when the configuration loads, naming the key.
    let bad = [
        (
            "AGENTLOOP_DECISION_PRICES__M__INPUT_USD_PER_MTOK",
            "0.0000001",
        ),
        ("AGENTLOOP_DECISION_PRICES__M__OUTPUT_USD_PER_MTOK", "1"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let error = agentloop_server::config::load_from::<DecisionConfig>(
        None,
        bad,
        "AGENTLOOP_DECISION_",
        NoFlags {},
    )
    .unwrap_err();
    assert!(
        error.to_string().contains("prices.m.input_usd_per_mtok")
            && error.to_string().contains("micro-dollar"),
        "{error}"
    );
}
