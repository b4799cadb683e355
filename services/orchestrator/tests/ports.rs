//! The gRPC ports against services on a real loopback server: the tool port's stages
//! stop after an old gateway says it does not know them, and only then; the decision
//! port sends a model only what it reads, and everything again when it reads more.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};

use agentloop_decision::{
    DecisionServer, Model, ModelError, ModelReply, Proposal, Question, Reads,
};
use agentloop_engine::{
    Answer, CallId, Event, EventBody, ProposedDecision, SideEffect, ToolCall, UnixMillis, Usage,
};
use agentloop_orchestrator::grpc::{Decision, Remote, Tools};
use agentloop_proto::client::{self, Transport};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::decision_service_server::DecisionService;
use agentloop_proto::v1::tool_gateway_service_client::ToolGatewayServiceClient;
use agentloop_proto::v1::tool_gateway_service_server::ToolGatewayService;
use agentloop_runtime::ports::{Ask, DecisionPort, Dispatch, FailureKind, Tool, ToolsPort};
use agentloop_store::StoredEvent;
use tonic::{Code, Request, Response, Status};

/// A gateway whose `ExecuteStage` fails with the given code, each time it is asked.
struct Failing {
    code: Code,
    asked: Arc<Mutex<u32>>,
}

#[tonic::async_trait]
impl ToolGatewayService for Failing {
    async fn list_tools(
        &self,
        _request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        Ok(Response::new(pb::ListToolsResponse::default()))
    }

    async fn execute(
        &self,
        _request: Request<pb::ToolGatewayServiceExecuteRequest>,
    ) -> Result<Response<pb::ToolGatewayServiceExecuteResponse>, Status> {
        Err(Status::unavailable("not in this test"))
    }

    async fn execute_stage(
        &self,
        _request: Request<pb::ExecuteStageRequest>,
    ) -> Result<Response<pb::ExecuteStageResponse>, Status> {
        *self.asked.lock().unwrap() += 1;
        Err(Status::new(self.code, "as told"))
    }

    async fn reconcile(
        &self,
        _request: Request<pb::ToolGatewayServiceReconcileRequest>,
    ) -> Result<Response<pb::ToolGatewayServiceReconcileResponse>, Status> {
        Err(Status::unavailable("not in this test"))
    }

    async fn verify(
        &self,
        _request: Request<pb::ToolGatewayServiceVerifyRequest>,
    ) -> Result<Response<pb::ToolGatewayServiceVerifyResponse>, Status> {
        Err(Status::unavailable("not in this test"))
    }

    async fn register_executor(
        &self,
        _request: Request<pb::RegisterExecutorRequest>,
    ) -> Result<Response<pb::RegisterExecutorResponse>, Status> {
        Err(Status::unavailable("not in this test"))
    }

    async fn deregister_executor(
        &self,
        _request: Request<pb::DeregisterExecutorRequest>,
    ) -> Result<Response<pb::DeregisterExecutorResponse>, Status> {
        Err(Status::unavailable("not in this test"))
    }
}

/// Serves `services` on a loopback port until the test ends; a channel to them.
async fn serve(services: agentloop_server::ServiceSet) -> Transport {
    let (listener, endpoint) = common::listener().await;
    tokio::spawn(agentloop_server::serve(
        listener,
        services,
        std::future::pending(),
    ));
    common::channel(&endpoint).await
}

/// The port, over gRPC, to a gateway that fails stages with `code`.
/// Returns the port and the count of stages the gateway was asked.
async fn port_to(
    code: Code,
) -> (
    Tools<Remote<ToolGatewayServiceClient<Transport>>>,
    Arc<Mutex<u32>>,
) {
    let asked = Arc::new(Mutex::new(0));
    let gateway = Failing {
        code,
        asked: asked.clone(),
    };
    let services =
        agentloop_server::ServiceSet::new().add(agentloop_proto::server::tool_gateway(gateway));
    let transport = serve(services).await;
    (
        Tools::remote(Remote(client::tool_gateway(transport))),
        asked,
    )
}

fn call(id: &str) -> ToolCall {
    ToolCall {
        call_id: CallId::new(id),
        tool: "lookup".into(),
        arguments_json: "{}".into(),
    }
}

fn dispatch(call: &ToolCall) -> Dispatch<'_> {
    Dispatch {
        invocation: uuid::Uuid::nil(),
        call,
        effect_key: "",
        attempt: 1,
        timeout_ms: 1_000,
        digest: None,
        answer: None,
    }
}

#[tokio::test]
async fn a_gateway_without_stages_gets_calls_one_by_one_from_then_on() {
    let (port, asked) = port_to(Code::Unimplemented).await;
    let (a, b) = (call("a"), call("b"));
    let stage = [dispatch(&a), dispatch(&b)];
    assert!(port.max_stage() > 1);
    let failure = port.execute_stage(&stage).await.unwrap_err();
    assert_eq!(failure.kind, FailureKind::Unimplemented);
    assert_eq!(port.max_stage(), 1);
    assert_eq!(*asked.lock().unwrap(), 1);
}

#[tokio::test]
async fn a_failed_stage_of_a_gateway_that_has_them_keeps_stages_on() {
    let (port, asked) = port_to(Code::Unavailable).await;
    let (a, b) = (call("a"), call("b"));
    let stage = [dispatch(&a), dispatch(&b)];
    for _ in 0..2 {
        let failure = port.execute_stage(&stage).await.unwrap_err();
        assert_eq!(failure.kind, FailureKind::Unavailable);
        assert!(port.max_stage() > 1);
    }
    assert_eq!(*asked.lock().unwrap(), 2);
}

/// A model that reads the last `reads` events, and the tools when `tools`, and keeps
/// how many events each question showed it.
#[derive(Debug, Default)]
struct Reader {
    reads: AtomicUsize,
    tools: AtomicBool,
    shown: Mutex<Vec<usize>>,
}

#[tonic::async_trait]
impl Model for Reader {
    async fn decide_with(
        &self,
        question: &Question<'_>,
        _tools: &[pb::ToolDescriptor],
    ) -> Result<ModelReply, ModelError> {
        self.shown.lock().unwrap().push(question.history.len());
        Ok(ModelReply {
            proposal: Proposal::Decision(ProposedDecision::Final {
                answer: "done".into(),
                evidence: Vec::new(),
            }),
            usage: Usage::default(),
            model: "reader".into(),
            response_id: String::new(),
        })
    }

    fn reads(&self) -> Reads {
        Reads {
            history: self.reads.load(Relaxed),
            tools: self.tools.load(Relaxed),
        }
    }

    fn provider(&self) -> &'static str {
        "reader"
    }

    fn request_model(&self) -> &str {
        "reader"
    }
}

/// The decision service, keeping the number of events and tools of every request.
struct Recording {
    server: DecisionServer,
    requests: Arc<Mutex<Vec<(usize, usize)>>>,
}

#[tonic::async_trait]
impl DecisionService for Recording {
    async fn decide(
        &self,
        request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        let sent = (
            request.get_ref().history.len(),
            request.get_ref().tools.len(),
        );
        self.requests.lock().unwrap().push(sent);
        DecisionService::decide(&self.server, request).await
    }
}

fn stored(seq: u64) -> StoredEvent {
    let body = EventBody::ClarificationAnswered(Answer {
        answer: format!("answer {seq}"),
        actor: "ana".into(),
        waited_ms: 1,
        action: None,
    });
    StoredEvent {
        committed_at: UnixMillis(seq),
        event: Event { seq, body },
    }
}

fn tool(name: &str) -> Tool {
    Tool {
        name: name.into(),
        description: "looks up".into(),
        input_schema_json: r#"{"type":"object"}"#.into(),
        side_effect: SideEffect::ReadOnly,
        commutative: false,
        timeout_ms: None,
        requires_approval: false,
        digest: None,
        unavailable: false,
    }
}

#[tokio::test]
async fn the_decision_port_sends_what_the_model_reads_and_all_again_when_it_reads_more() {
    let model = Arc::new(Reader::default());
    model.reads.store(1, Relaxed);
    let requests = Arc::new(Mutex::new(Vec::new()));
    let shared: Arc<dyn Model> = model.clone();
    let service = Recording {
        server: DecisionServer::new(Some(shared)),
        requests: requests.clone(),
    };
    let services =
        agentloop_server::ServiceSet::new().add(agentloop_proto::server::decision(service));
    let port = Decision::new(client::decision(serve(services).await));

    let history: Vec<Arc<StoredEvent>> = (1..=5).map(stored).map(Arc::new).collect();
    let tools = [tool("lookup"), tool("search")];
    let ask = |turn| Ask {
        invocation: uuid::Uuid::nil(),
        turn,
        profile: "default",
        goal: "find it",
        history: &history,
        script: None,
        tools: &tools,
    };
    let taken =
        |requests: &Arc<Mutex<Vec<(usize, usize)>>>| std::mem::take(&mut *requests.lock().unwrap());

    // Nothing known yet: the whole window and every tool; the answer says what it read.
    let decided = port.decide(ask(1)).await.unwrap();
    assert!(matches!(decided.decision, ProposedDecision::Final { .. }));
    assert_eq!(taken(&requests), [(5, 2)]);
    // From then on, only the last event and no tools; the model is shown the same.
    port.decide(ask(2)).await.unwrap();
    assert_eq!(taken(&requests), [(1, 0)]);

    // The model now reads three: the trimmed request is refused before the model is
    // asked, and the turn goes again whole, once.
    model.reads.store(3, Relaxed);
    let decided = port.decide(ask(3)).await.unwrap();
    assert!(matches!(decided.decision, ProposedDecision::Final { .. }));
    assert_eq!(taken(&requests), [(1, 0), (5, 2)]);
    port.decide(ask(4)).await.unwrap();
    assert_eq!(taken(&requests), [(3, 0)]);

    // The same when it comes to read the tools.
    model.tools.store(true, Relaxed);
    port.decide(ask(5)).await.unwrap();
    assert_eq!(taken(&requests), [(3, 0), (5, 2)]);
    port.decide(ask(6)).await.unwrap();
    assert_eq!(taken(&requests), [(3, 2)]);

    // The model was asked once a turn: the refused requests never reached it.
    assert_eq!(*model.shown.lock().unwrap(), [5, 1, 5, 3, 5, 3]);
}
