#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]
//! PolicyService over real gRPC on 127.0.0.1 port 0, with descriptors listed from a
//! fake tool gateway (also on port 0).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop_policy::{PolicyConfig, PolicyError, PolicyServer, fetch_tools};
use agentloop_proto::client::ClientConfig;
use agentloop_proto::v1::tool_gateway_service_server::ToolGatewayService;
use agentloop_proto::v1::{
    self, EvaluateRequest, ListToolsRequest, ListToolsResponse, ToolCall, ToolDescriptor,
    ToolGatewayServiceExecuteRequest, ToolGatewayServiceExecuteResponse,
    ToolGatewayServiceReconcileRequest, ToolGatewayServiceReconcileResponse, ValidateFinalRequest,
    Verdict,
};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

/// A gateway that lists what it holds; a test may change it while policy follows it.
#[derive(Debug, Clone)]
struct FakeGateway(Arc<Mutex<ListToolsResponse>>);

impl FakeGateway {
    fn new(tools: Vec<ToolDescriptor>) -> FakeGateway {
        FakeGateway(Arc::new(Mutex::new(ListToolsResponse {
            tools,
            ..ListToolsResponse::default()
        })))
    }

    fn set(&self, tools: Vec<ToolDescriptor>, registry_digest: &str) {
        *self.0.lock().unwrap() = ListToolsResponse {
            tools,
            registry_digest: registry_digest.into(),
        };
    }
}

#[tonic::async_trait]
impl ToolGatewayService for FakeGateway {
    async fn list_tools(
        &self,
        _request: tonic::Request<ListToolsRequest>,
    ) -> Result<tonic::Response<ListToolsResponse>, tonic::Status> {
        Ok(tonic::Response::new(self.0.lock().unwrap().clone()))
    }
    async fn execute(
        &self,
        _request: tonic::Request<ToolGatewayServiceExecuteRequest>,
    ) -> Result<tonic::Response<ToolGatewayServiceExecuteResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn execute_stage(
        &self,
        _request: tonic::Request<v1::ExecuteStageRequest>,
    ) -> Result<tonic::Response<v1::ExecuteStageResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn reconcile(
        &self,
        _request: tonic::Request<ToolGatewayServiceReconcileRequest>,
    ) -> Result<tonic::Response<ToolGatewayServiceReconcileResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("fake"))
    }

    async fn verify(
        &self,
        _request: tonic::Request<agentloop_proto::v1::ToolGatewayServiceVerifyRequest>,
    ) -> Result<tonic::Response<agentloop_proto::v1::ToolGatewayServiceVerifyResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented("fake"))
    }

    async fn register_executor(
        &self,
        _request: tonic::Request<v1::RegisterExecutorRequest>,
    ) -> Result<tonic::Response<v1::RegisterExecutorResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("fake"))
    }

    async fn deregister_executor(
        &self,
        _request: tonic::Request<v1::DeregisterExecutorRequest>,
    ) -> Result<tonic::Response<v1::DeregisterExecutorResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("fake"))
    }
}

async fn listen() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    (listener, endpoint)
}

fn descriptors() -> Vec<ToolDescriptor> {
    let tool = |name: &str, side_effect: v1::SideEffect, schema: &str| ToolDescriptor {
        name: name.into(),
        input_schema_json: schema.into(),
        side_effect: side_effect.into(),
        ..ToolDescriptor::default()
    };
    vec![
        tool(
            "lookup",
            v1::SideEffect::ReadOnly,
            r#"{"type":"object","properties":{"key":{"type":"string"}},"required":["key"]}"#,
        ),
        tool("transfer", v1::SideEffect::Write, r#"{"type":"object"}"#),
    ]
}

fn call(id: &str, tool: &str, args: &str) -> ToolCall {
    ToolCall {
        call_id: id.into(),
        tool: tool.into(),
        arguments_json: args.into(),
    }
}

#[tokio::test]
async fn evaluate_and_validate_over_grpc_with_tools_from_the_gateway() {
    let (gateway_listener, gateway) = listen().await;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(agentloop_proto::server::tool_gateway(FakeGateway::new(
                descriptors(),
            )))
            .serve_with_incoming(TcpListenerStream::new(gateway_listener)),
    );
    let config = PolicyConfig {
        tools_endpoint: Some(gateway),
        require_approval_for: vec!["transfer".into()],
        ..PolicyConfig::default()
    };
    let server = PolicyServer::from_config(&config).await.unwrap();

    let (listener, endpoint) = listen().await;
    tokio::spawn(agentloop_policy::run(
        listener,
        server,
        agentloop_server::Access::default(),
        std::future::pending(),
    ));
    let channel = agentloop_proto::client::connect(
        &endpoint,
        agentloop_proto::client::ClientConfig::default(),
    )
    .await
    .unwrap();
    let mut client = agentloop_proto::client::policy(channel);

    let request = |calls: Vec<ToolCall>| EvaluateRequest {
        invocation_id: "inv-1".into(),
        turn: 2,
        calls,
        ..EvaluateRequest::default()
    };
    let allowed = client
        .evaluate(request(vec![
            call("a", "lookup", r#"{"key":"x"}"#),
            call("b", "lookup", r#"{"key":"y"}"#),
        ]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allowed.verdict(), Verdict::Allow);

    let denied = client
        .evaluate(request(vec![
            call("a", "lookup", r#"{"key":1}"#),
            call("b", "grep", "{}"),
        ]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(denied.verdict(), Verdict::Deny);
    assert_eq!(denied.violations.len(), 2);
    assert_eq!(denied.violations[0].call_id, "a");
    assert!(
        denied.violations[0]
            .message
            .starts_with("arguments at /key: "),
        "{:?}",
        denied.violations
    );
    assert_eq!(denied.violations[1].message, r#"unknown tool "grep""#);

    let gated = client
        .evaluate(request(vec![call("t", "transfer", r#"{"amount":1}"#)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gated.verdict(), Verdict::RequireApproval);
    let mut approved = request(vec![call("t2", "transfer", r#"{ "amount" : 1 }"#)]);
    approved.approved_proposal_digest = gated.proposal_digest.clone();
    let approved = client.evaluate(approved).await.unwrap().into_inner();
    assert_eq!(approved.verdict(), Verdict::Allow);

    let mut no_id = request(vec![]);
    no_id.invocation_id.clear();
    let status = client.evaluate(no_id).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("invocation_id"));

    let answer = |text: &str| ValidateFinalRequest {
        profile: "default".into(),
        claim: Some(agentloop_proto::v1::Claim {
            invocation_id: "inv-1".into(),
            answer: text.into(),
            ..Default::default()
        }),
    };
    let accepted = client
        .validate_final(answer("42"))
        .await
        .unwrap()
        .into_inner();
    assert!(accepted.accepted);
    let refused = client
        .validate_final(answer(""))
        .await
        .unwrap()
        .into_inner();
    assert!(!refused.accepted);
    assert_eq!(refused.reasons, vec!["answer: the answer is empty"]);
    let status = client
        .validate_final(ValidateFinalRequest {
            profile: "default".into(),
            claim: None,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn an_unreachable_gateway_fails_after_the_bounded_retry() {
    // A port that was free a moment ago and has no listener now.
    let (listener, endpoint) = listen().await;
    drop(listener);
    let error = fetch_tools(
        &endpoint,
        ClientConfig::default(),
        3,
        Duration::from_millis(1),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, PolicyError::ToolsUnavailable { attempts: 3, .. }),
        "{error}"
    );
    assert!(matches!(
        PolicyServer::from_config(&PolicyConfig::default())
            .await
            .unwrap_err(),
        PolicyError::NoToolSource
    ));
}

#[tokio::test]
async fn a_gateway_serving_a_bad_schema_fails_setup_naming_the_tool() {
    let (gateway_listener, gateway) = listen().await;
    let bad = vec![ToolDescriptor {
        name: "broken".into(),
        input_schema_json: r#"{"type": 12}"#.into(),
        ..ToolDescriptor::default()
    }];
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(agentloop_proto::server::tool_gateway(FakeGateway::new(bad)))
            .serve_with_incoming(TcpListenerStream::new(gateway_listener)),
    );
    let config = PolicyConfig {
        tools_endpoint: Some(gateway),
        ..PolicyConfig::default()
    };
    let error = PolicyServer::from_config(&config).await.unwrap_err();
    assert!(
        matches!(error, PolicyError::InvalidSchema { ref tool, .. } if tool == "broken"),
        "{error}"
    );
}

#[tokio::test]
async fn tools_can_come_from_the_registry_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    std::fs::write(
        &path,
        r#"
[[tools]]
name = "lookup"
endpoint = "http://127.0.0.1:50061"
description = "Looks things up."
side_effect = "read_only"
timeout_ms = 1000
input_schema = '{"type":"object","properties":{"key":{"type":"string"}},"required":["key"]}'

[[tools]]
name = "transfer"
endpoint = "http://127.0.0.1:50061"
description = "Moves money."
side_effect = "write"
timeout_ms = 1000
input_schema = '{"type":"object"}'
"#,
    )
    .unwrap();
    let config = PolicyConfig {
        tools_file: Some(path.clone()),
        ..PolicyConfig::default()
    };
    let server = PolicyServer::from_config(&config).await.unwrap();
    let request = EvaluateRequest {
        invocation_id: "inv-1".into(),
        calls: vec![
            call("a", "lookup", "{}"),
            call("b", "transfer", "{}"),
            call("c", "lookup", r#"{"key":"k"}"#),
        ],
        ..EvaluateRequest::default()
    };
    let denied = server.evaluate(request.clone()).unwrap();
    assert_eq!(denied.verdict(), Verdict::Deny);
    assert_eq!(denied.violations.len(), 1);
    assert_eq!(denied.violations[0].call_id, "a");
    let mut fixed = request;
    fixed.calls[0].arguments_json = r#"{"key":"j"}"#.into();
    let allowed = server.evaluate(fixed).unwrap();
    assert_eq!(allowed.verdict(), Verdict::Allow, "{allowed:?}");

    let both = PolicyConfig {
        tools_endpoint: Some("http://127.0.0.1:1".into()),
        ..config
    };
    assert_eq!(
        PolicyServer::from_config(&both).await.unwrap_err(),
        PolicyError::ConflictingToolSources
    );
    let missing = PolicyConfig {
        tools_file: Some(dir.path().join("nope.toml")),
        ..PolicyConfig::default()
    };
    assert!(matches!(
        PolicyServer::from_config(&missing).await.unwrap_err(),
        PolicyError::ToolsFile { .. }
    ));
}

/// Policy lists the gateway's tools again every `tools_refresh_ms`: a tool an executor
/// registers later is judged by its schema without a restart, one that went away is
/// unknown, and a listing with the same registry digest is not recompiled.
#[tokio::test]
async fn policy_follows_the_gateway_as_its_tools_change() {
    let (gateway_listener, endpoint) = listen().await;
    let gateway = FakeGateway::new(descriptors());
    gateway.set(descriptors(), "v1");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(agentloop_proto::server::tool_gateway(gateway.clone()))
            .serve_with_incoming(TcpListenerStream::new(gateway_listener)),
    );
    let config = PolicyConfig {
        tools_endpoint: Some(endpoint),
        tools_refresh_ms: 20,
        ..PolicyConfig::default()
    };
    let server = PolicyServer::from_config(&config).await.unwrap();
    let follow = tokio::spawn(server.follow_gateway().await.unwrap().unwrap());
    let judge = |server: &PolicyServer, call: ToolCall| {
        server
            .evaluate(EvaluateRequest {
                invocation_id: "inv-1".into(),
                turn: 1,
                calls: vec![call],
                ..EvaluateRequest::default()
            })
            .unwrap()
    };
    let refund = || call("r", "refund", r#"{"order":"o-1"}"#);
    let denied = judge(&server, refund());
    assert_eq!(denied.verdict(), Verdict::Deny);
    assert_eq!(denied.violations[0].message, r#"unknown tool "refund""#);

    // An executor registers `refund`; lookup's executor goes away.
    let refund_tool = ToolDescriptor {
        name: "refund".into(),
        input_schema_json: r#"{"type":"object","required":["order"]}"#.into(),
        side_effect: v1::SideEffect::Write.into(),
        ..ToolDescriptor::default()
    };
    let mut changed = descriptors();
    changed.retain(|d| d.name != "lookup");
    changed.push(refund_tool);
    gateway.set(changed, "v2");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while judge(&server, refund()).verdict() != Verdict::Allow {
        assert!(
            tokio::time::Instant::now() < deadline,
            "policy never saw refund"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // Judged by the new tool's schema, and the one that went away is unknown.
    let bad = judge(&server, call("r2", "refund", "{}"));
    assert_eq!(bad.verdict(), Verdict::Deny);
    let gone = judge(&server, call("l", "lookup", r#"{"key":"x"}"#));
    assert_eq!(gone.violations[0].message, r#"unknown tool "lookup""#);

    // The same digest is not taken again, whatever the listing holds.
    assert!(
        !server
            .update(ListToolsResponse {
                tools: Vec::new(),
                registry_digest: "v2".into(),
            })
            .unwrap()
    );
    assert_eq!(judge(&server, refund()).verdict(), Verdict::Allow);
    follow.abort();
}
