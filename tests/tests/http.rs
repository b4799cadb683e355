//! The public API over both of its transports: each scenario runs once over gRPC and once
//! over HTTP/JSON (`http_listen`), against the one implementation of each RPC, and must
//! see the same answers, the same errors and the same tenancy. Then what only HTTP has:
//! its own refusals (no route, wrong method, a body too large, another site's page),
//! Server-Sent Events, and the OpenAPI document and the console it serves.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use agentloop_auth::testing::{Alg, TokenIssuer};
use agentloop_e2e::*;
use agentloop_orchestrator::OrchestratorConfig;
use agentloop_proto::v1 as pb;
use futures::StreamExt;
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage};
use tonic::{Code, Status};

/// Runs `$name` over each transport.
macro_rules! both_transports {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn grpc() {
                    super::$name(super::Via::Grpc).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn http() {
                    super::$name(super::Via::Http).await;
                }
            }
        )*
    };
}

both_transports!(
    a_run_is_started_watched_listed_and_read,
    an_approved_write_is_applied_exactly_once,
    a_cancel_ends_a_running_invocation,
    errors_are_the_same_status,
    tenants_and_roles_hold,
);

/// Two lookups, then an answer citing them.
const LOOKUPS: &str = r#"{"turns": [
  {"tool_calls": [{"id": "a", "name": "lookup", "arguments": {"key": "profile"}},
                  {"id": "b", "name": "lookup", "arguments": {"key": "policy"}}]},
  {"final": "profile=active; policy=refund-under-100", "evidence": ["a", "b"]}]}"#;

/// Asks for an approval of one transfer, then answers.
const APPROVE_THEN_FINAL: &str = r#"{"turns": [
  {"request_approval": {"summary": "move 42.00", "calls": [
    {"id": "t1", "name": "transfer", "arguments": {"from": "alice", "to": "bob", "amount": 4200}}]}},
  {"final": "moved"}]}"#;

/// Sleeps for a minute in turn 1.
const SLEEPING: &str =
    r#"{"turns": [{"tool_calls": [{"id": "s", "name": "sleep", "arguments": {"ms": 60000}}]}]}"#;

/// The transport a scenario calls through.
#[derive(Debug, Clone, Copy)]
enum Via {
    Grpc,
    Http,
}

/// The API as a caller of one transport sees it, answering in the gRPC API's types.
enum Caller {
    Grpc(Client),
    Http(Http),
}

/// An HTTP/JSON caller: a bearer token, and the descriptors it reads JSON with.
struct Http {
    base: String,
    token: Option<String>,
    client: reqwest::Client,
    pool: DescriptorPool,
}

/// An open watch.
enum Watch {
    Grpc(tonic::Streaming<pb::WatchInvocationResponse>),
    Http {
        response: reqwest::Response,
        buffer: String,
    },
}

async fn system(config: OrchestratorConfig) -> System {
    let config = OrchestratorConfig {
        http_listen: Some(([127, 0, 0, 1], 0).into()),
        ..config
    };
    System::start(Wiring::Embedded, config).await
}

async fn caller(system: &System, via: Via, token: Option<&str>) -> Caller {
    match via {
        Via::Grpc => {
            let transport = agentloop_stack::channel_as(&system.stack().endpoint(), token)
                .await
                .unwrap();
            Caller::Grpc(agentloop_proto::client::orchestrator(transport))
        }
        Via::Http => Caller::Http(Http {
            base: system.stack().http_endpoint().expect("HTTP is on"),
            token: token.map(str::to_owned),
            client: reqwest::Client::new(),
            pool: DescriptorPool::decode(agentloop_proto::FILE_DESCRIPTOR_SET).unwrap(),
        }),
    }
}

impl Http {
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.client.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// `message` in its JSON form.
    fn json<M: Message>(&self, name: &str, message: &M) -> String {
        let descriptor = self.pool.get_message_by_name(name).unwrap();
        let dynamic =
            DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice()).unwrap();
        serde_json::to_string(&dynamic).unwrap()
    }

    /// An answer: its message from JSON, or the status its `google.rpc.Status` body
    /// gives, checked against the HTTP status.
    async fn answer<M: Message + Default>(
        &self,
        name: &str,
        response: reqwest::Response,
    ) -> Result<M, Status> {
        let http_status = response.status();
        let body = response.bytes().await.unwrap();
        if !http_status.is_success() {
            return Err(status_of(http_status, &body));
        }
        let descriptor = self.pool.get_message_by_name(name).unwrap();
        let mut json = serde_json::Deserializer::from_slice(&body);
        let dynamic = DynamicMessage::deserialize(descriptor, &mut json).unwrap();
        Ok(M::decode(dynamic.encode_to_vec().as_slice()).unwrap())
    }

    /// A GET of `path` for the RPC `rpc`, each field of `request`'s JSON form a query
    /// parameter.
    async fn get<Q: Message, M: Message + Default>(
        &self,
        path: &str,
        rpc: &str,
        request: &Q,
    ) -> Result<M, Status> {
        let json: serde_json::Value =
            serde_json::from_str(&self.json(&format!("agentloop.v1.{rpc}Request"), request))
                .unwrap();
        let mut url = reqwest::Url::parse(&format!("{}{path}", self.base)).unwrap();
        for (name, value) in json.as_object().unwrap() {
            let text = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned);
            url.query_pairs_mut().append_pair(name, &text);
        }
        let path = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        self.call(
            reqwest::Method::GET,
            &path,
            None,
            &format!("agentloop.v1.{rpc}Response"),
        )
        .await
    }

    async fn call<M: Message + Default>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<String>,
        answer: &str,
    ) -> Result<M, Status> {
        let mut request = self.request(method, path);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        self.answer(answer, request.send().await.unwrap()).await
    }
}

/// The status of an HTTP error answer, which must be a `google.rpc.Status` whose code
/// maps to the HTTP status.
fn status_of(http_status: reqwest::StatusCode, body: &[u8]) -> Status {
    let status: serde_json::Value = serde_json::from_slice(body)
        .unwrap_or_else(|_| panic!("not a status: {}", String::from_utf8_lossy(body)));
    let code = Code::from_i32(status["code"].as_i64().unwrap() as i32);
    let expected = match code {
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
        Code::Unauthenticated => 401,
        Code::PermissionDenied => 403,
        Code::NotFound => 404,
        Code::AlreadyExists | Code::Aborted => 409,
        Code::ResourceExhausted => 429,
        Code::Unimplemented => 501,
        Code::Unavailable => 503,
        other => panic!("unexpected code {other:?}"),
    };
    assert_eq!(http_status.as_u16(), expected, "{status}");
    assert!(status["details"].is_array(), "{status}");
    Status::new(code, status["message"].as_str().unwrap())
}

impl Caller {
    async fn start(
        &mut self,
        request: pb::StartInvocationRequest,
    ) -> Result<pb::StartInvocationResponse, Status> {
        match self {
            Caller::Grpc(client) => Ok(client.start_invocation(request).await?.into_inner()),
            Caller::Http(http) => {
                let body = http.json("agentloop.v1.StartInvocationRequest", &request);
                http.call(
                    reqwest::Method::POST,
                    "/v1/invocations",
                    Some(body),
                    "agentloop.v1.StartInvocationResponse",
                )
                .await
            }
        }
    }

    /// Starts a scripted run; its ID.
    async fn start_script(&mut self, script: &str) -> String {
        self.start(start_request(script))
            .await
            .unwrap()
            .invocation
            .unwrap()
            .invocation_id
    }

    /// Starts a run that waits for a human, and watches it until it does.
    async fn start_waiting(&mut self, script: &str) -> (String, Watch) {
        let id = self.start_script(script).await;
        let mut watch = self.watch(&id, 1).await.unwrap();
        watch.until(&pool(), waiting).await;
        (id, watch)
    }

    async fn get(&mut self, id: &str) -> Result<pb::Invocation, Status> {
        let response: pb::GetInvocationResponse = match self {
            Caller::Grpc(client) => client
                .get_invocation(pb::GetInvocationRequest {
                    invocation_id: id.into(),
                })
                .await?
                .into_inner(),
            Caller::Http(http) => {
                http.call(
                    reqwest::Method::GET,
                    &format!("/v1/invocations/{id}"),
                    None,
                    "agentloop.v1.GetInvocationResponse",
                )
                .await?
            }
        };
        Ok(response.invocation.unwrap())
    }

    async fn list(
        &mut self,
        request: pb::ListInvocationsRequest,
    ) -> Result<Vec<pb::Invocation>, Status> {
        let response: pb::ListInvocationsResponse = match self {
            Caller::Grpc(client) => client.list_invocations(request).await?.into_inner(),
            Caller::Http(http) => {
                http.get("/v1/invocations", "ListInvocations", &request)
                    .await?
            }
        };
        Ok(response.invocations)
    }

    async fn stats(
        &mut self,
        request: pb::GetInvocationStatsRequest,
    ) -> Result<pb::GetInvocationStatsResponse, Status> {
        match self {
            Caller::Grpc(client) => Ok(client.get_invocation_stats(request).await?.into_inner()),
            Caller::Http(http) => {
                http.get("/v1/invocations:stats", "GetInvocationStats", &request)
                    .await
            }
        }
    }

    /// Every ledger entry of an invocation.
    async fn effects(&mut self, id: &str) -> Result<Vec<pb::EffectEntry>, Status> {
        let request = pb::ListEffectsRequest {
            invocation_id: id.into(),
            ..Default::default()
        };
        let response: pb::ListEffectsResponse = match self {
            Caller::Grpc(client) => client.list_effects(request).await?.into_inner(),
            Caller::Http(http) => {
                // The path carries the ID; the request's other fields are the query.
                let rest = pb::ListEffectsRequest {
                    invocation_id: String::new(),
                    ..request
                };
                http.get(
                    &format!("/v1/invocations/{id}/effects"),
                    "ListEffects",
                    &rest,
                )
                .await?
            }
        };
        Ok(response.entries)
    }

    async fn list_in(&mut self, state: pb::InvocationState) -> Result<Vec<pb::Invocation>, Status> {
        self.list(pb::ListInvocationsRequest {
            state: state.into(),
            ..Default::default()
        })
        .await
    }

    async fn watch(&mut self, id: &str, from_seq: u64) -> Result<Watch, Status> {
        match self {
            Caller::Grpc(client) => Ok(Watch::Grpc(
                client
                    .watch_invocation(pb::WatchInvocationRequest {
                        invocation_id: id.into(),
                        from_seq,
                    })
                    .await?
                    .into_inner(),
            )),
            Caller::Http(http) => {
                let response = http
                    .request(
                        reqwest::Method::GET,
                        &format!("/v1/invocations/{id}/events?fromSeq={from_seq}"),
                    )
                    .send()
                    .await
                    .unwrap();
                if !response.status().is_success() {
                    let status = response.status();
                    return Err(status_of(status, &response.bytes().await.unwrap()));
                }
                assert_eq!(
                    response.headers()["content-type"],
                    "text/event-stream",
                    "a watch is Server-Sent Events"
                );
                Ok(Watch::Http {
                    response,
                    buffer: String::new(),
                })
            }
        }
    }

    async fn cancel(&mut self, id: &str) -> Result<(), Status> {
        let request = pb::CancelInvocationRequest {
            invocation_id: id.into(),
            reason: "the caller changed its mind".into(),
        };
        match self {
            Caller::Grpc(client) => client.cancel_invocation(request).await.map(drop),
            Caller::Http(http) => {
                let body = http.json("agentloop.v1.CancelInvocationRequest", &request);
                http.call::<pb::CancelInvocationResponse>(
                    reqwest::Method::POST,
                    &format!("/v1/invocations/{id}:cancel"),
                    Some(body),
                    "agentloop.v1.CancelInvocationResponse",
                )
                .await
                .map(drop)
            }
        }
    }

    async fn resolve(
        &mut self,
        request: pb::ResolveApprovalRequest,
    ) -> Result<pb::Invocation, Status> {
        let response: pb::ResolveApprovalResponse = match self {
            Caller::Grpc(client) => client.resolve_approval(request).await?.into_inner(),
            Caller::Http(http) => {
                let path = format!("/v1/invocations/{}:resolveApproval", request.invocation_id);
                let body = http.json("agentloop.v1.ResolveApprovalRequest", &request);
                http.call(
                    reqwest::Method::POST,
                    &path,
                    Some(body),
                    "agentloop.v1.ResolveApprovalResponse",
                )
                .await?
            }
        };
        Ok(response.invocation.unwrap())
    }
}

impl Watch {
    /// The next event; `None` when the stream ended.
    async fn next(&mut self, pool: &DescriptorPool) -> Option<Result<pb::Event, Status>> {
        match self {
            Watch::Grpc(stream) => {
                let item = stream.next().await?;
                Some(item.map(|response| response.event.unwrap()))
            }
            Watch::Http { response, buffer } => loop {
                if let Some(end) = buffer.find("\n\n") {
                    let event: String = buffer.drain(..end + 2).collect();
                    let mut kind = "message";
                    let mut data = "";
                    for line in event.lines() {
                        if let Some(value) = line.strip_prefix("event: ") {
                            kind = value;
                        } else if let Some(value) = line.strip_prefix("data: ") {
                            data = value;
                        }
                    }
                    let fields = serde_json::json!({"event": kind, "data": data});
                    if let Err(error) = event_schema().validate(&fields) {
                        panic!(
                            "an event the OpenAPI document does not describe: {error}: {fields}"
                        );
                    }
                    if kind == "error" {
                        let status: serde_json::Value = serde_json::from_str(data).unwrap();
                        return Some(Err(Status::new(
                            Code::from_i32(status["code"].as_i64().unwrap() as i32),
                            status["message"].as_str().unwrap(),
                        )));
                    }
                    let descriptor = pool
                        .get_message_by_name("agentloop.v1.WatchInvocationResponse")
                        .unwrap();
                    let mut json = serde_json::Deserializer::from_str(data);
                    let dynamic = DynamicMessage::deserialize(descriptor, &mut json).unwrap();
                    let response =
                        pb::WatchInvocationResponse::decode(dynamic.encode_to_vec().as_slice())
                            .unwrap();
                    return Some(Ok(response.event.unwrap()));
                }
                let chunk = response.chunk().await.unwrap()?;
                buffer.push_str(std::str::from_utf8(&chunk).unwrap());
            },
        }
    }

    /// Events up to and including the first that `stop` accepts (bounded).
    async fn until(
        &mut self,
        pool: &DescriptorPool,
        stop: impl Fn(&pb::Event) -> bool,
    ) -> Vec<pb::Event> {
        tokio::time::timeout(PATIENCE, async {
            let mut events = Vec::new();
            while let Some(event) = self.next(pool).await {
                let event = event.unwrap();
                let done = stop(&event);
                events.push(event);
                if done {
                    return events;
                }
            }
            panic!("the watch ended before the event looked for: {events:?}");
        })
        .await
        .expect("the event looked for never came")
    }
}

/// The committed OpenAPI document's schema of one Server-Sent Event (read as its fields,
/// as clients such as schemathesis read it), which every event the tests receive over
/// HTTP must match.
fn event_schema() -> &'static jsonschema::Validator {
    static SCHEMA: std::sync::OnceLock<jsonschema::Validator> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| {
        let document: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json"))
                .unwrap(),
        )
        .unwrap();
        let schema = &document["paths"]["/v1/invocations/{invocation_id}/events"]["get"]
            ["responses"]["200"]["content"]["text/event-stream"]["schema"];
        jsonschema::validator_for(schema).unwrap()
    })
}

fn pool() -> DescriptorPool {
    DescriptorPool::decode(agentloop_proto::FILE_DESCRIPTOR_SET).unwrap()
}

/// The final end of an invocation (not a wait).
fn final_end(event: &pb::Event) -> bool {
    matches!(&event.body, Some(pb::event::Body::Ended(ended)) if ended.wait_until.is_none())
}

/// A wait for a human.
fn waiting(event: &pb::Event) -> bool {
    matches!(&event.body, Some(pb::event::Body::Ended(ended)) if ended.wait_until.is_some())
}

fn ended(events: &[pb::Event]) -> &pb::InvocationEnded {
    events
        .iter()
        .rev()
        .find_map(|event| match &event.body {
            Some(pb::event::Body::Ended(ended)) => Some(ended),
            _ => None,
        })
        .expect("an end")
}

async fn a_run_is_started_watched_listed_and_read(via: Via) {
    let system = system(OrchestratorConfig::default()).await;
    let mut caller = caller(&system, via, None).await;
    let request = pb::StartInvocationRequest {
        idempotency_key: "order-7".into(),
        ..start_request(LOOKUPS)
    };
    let started = caller.start(request.clone()).await.unwrap();
    assert!(started.created);
    let id = started.invocation.unwrap().invocation_id;
    // The same key is the same invocation.
    let again = caller.start(request).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.invocation.unwrap().invocation_id, id);

    let mut watch = caller.watch(&id, 1).await.unwrap();
    let events = watch.until(&pool(), final_end).await;
    assert_eq!(events.first().unwrap().seq, 1, "from the first event");
    let turn = match &events[0].body {
        Some(pb::event::Body::Turn(turn)) => turn,
        other => panic!("{other:?}"),
    };
    assert_eq!(turn.results.len(), 2, "both lookups' results");
    let end = ended(&events);
    assert_eq!(end.reason(), pb::TerminalReason::Completed, "{end:?}");
    assert_eq!(
        end.answer.as_deref(),
        Some("profile=active; policy=refund-under-100")
    );
    // The stream ends after the final end.
    assert!(watch.next(&pool()).await.is_none());

    let read = caller.get(&id).await.unwrap();
    assert_eq!(read.state(), pb::InvocationState::Ended);
    assert_eq!(read.terminal_reason(), pb::TerminalReason::Completed);
    assert_eq!(read.last_seq, events.last().unwrap().seq);
    let ended_ones = caller.list_in(pb::InvocationState::Ended).await.unwrap();
    assert!(ended_ones.iter().any(|i| i.invocation_id == id));
    let running = caller.list_in(pb::InvocationState::Running).await.unwrap();
    assert!(running.iter().all(|i| i.invocation_id != id));
    // By the end's reason and the creation time.
    let listed = |reason: pb::TerminalReason, after, before| pb::ListInvocationsRequest {
        terminal_reason: reason.into(),
        created_after: after,
        created_before: before,
        ..Default::default()
    };
    let ids = |invocations: Vec<pb::Invocation>| -> Vec<String> {
        invocations.into_iter().map(|i| i.invocation_id).collect()
    };
    let created = read.created_at;
    let completed = listed(pb::TerminalReason::Completed, created, None);
    assert_eq!(
        ids(caller.list(completed).await.unwrap()),
        std::slice::from_ref(&id)
    );
    let cancelled = listed(pb::TerminalReason::Cancelled, None, None);
    assert!(caller.list(cancelled).await.unwrap().is_empty());
    let earlier = listed(pb::TerminalReason::Unspecified, None, created);
    assert!(caller.list(earlier).await.unwrap().is_empty());
    let backwards = listed(pb::TerminalReason::Unspecified, created, created);
    assert_eq!(
        caller.list(backwards).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    system.stop().await;
}

async fn an_approved_write_is_applied_exactly_once(via: Via) {
    let system = system(OrchestratorConfig::default()).await;
    let mut caller = caller(&system, via, None).await;
    let (id, mut watch) = caller.start_waiting(APPROVE_THEN_FINAL).await;
    let pending = caller.get(&id).await.unwrap();
    assert_eq!(pending.state(), pb::InvocationState::Waiting);
    let approval = pending.pending_approval.expect("waits for an approval");
    assert_eq!(approval.calls[0].tool, "transfer");
    // A wrong digest is refused and changes nothing.
    let wrong = caller
        .resolve(resolve_request(
            &id,
            &"0".repeat(64),
            pb::ApprovalVerdict::Approve,
        ))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::FailedPrecondition, "{wrong:?}");
    caller
        .resolve(resolve_request(
            &id,
            &approval.proposal_digest,
            pb::ApprovalVerdict::Approve,
        ))
        .await
        .unwrap();
    let events = watch.until(&pool(), final_end).await;
    assert_eq!(ended(&events).reason(), pb::TerminalReason::Completed);
    let applied = applied_for(system.executor(), &id);
    assert_eq!(applied.len(), 1, "the transfer once: {applied:?}");
    assert_eq!(applied[0].amount, 4200);
    // The ledger's entry beside the call, with the executor's receipt.
    let effects = caller.effects(&id).await.unwrap();
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(
        (effects[0].call_id.as_str(), effects[0].tool.as_str()),
        ("t1", "transfer")
    );
    assert_eq!(effects[0].state(), pb::EffectState::Committed);
    assert_eq!(effects[0].effect_key, applied[0].effect_key);
    assert!(!effects[0].receipt.is_empty());
    // The overview counts it: one completed run of two turns and one call.
    let stats = caller.stats(Default::default()).await.unwrap();
    assert_eq!((stats.invocations, stats.running, stats.waiting), (1, 0, 0));
    assert_eq!(stats.by_reason.len(), 1, "{stats:?}");
    assert_eq!(stats.by_reason[0].reason(), pb::TerminalReason::Completed);
    assert_eq!(stats.by_reason[0].count, 1);
    let completed = stats.completed.unwrap();
    assert_eq!(completed.runs, 1);
    assert!((completed.turns - 2.0).abs() < 1e-9, "{completed:?}");
    assert!((completed.tool_calls - 1.0).abs() < 1e-9, "{completed:?}");
    system.stop().await;
}

async fn a_cancel_ends_a_running_invocation(via: Via) {
    let system = system(OrchestratorConfig::default()).await;
    let mut caller = caller(&system, via, None).await;
    let mut stats = system.executor().watch_stats();
    let id = caller.start_script(SLEEPING).await;
    stats.wait_for(|s| s.sleeps_started == 1).await.unwrap();
    let mut watch = caller.watch(&id, 1).await.unwrap();
    caller.cancel(&id).await.unwrap();
    let events = watch.until(&pool(), final_end).await;
    assert_eq!(ended(&events).reason(), pb::TerminalReason::Cancelled);
    system.stop().await;
}

async fn errors_are_the_same_status(via: Via) {
    let system = system(OrchestratorConfig::default()).await;
    let mut caller = caller(&system, via, None).await;
    let unknown = "0190a8f2-0000-7000-8000-000000000001";
    // Each call is observed as a gRPC one is, whichever transport carried it.
    let not_found = || {
        system
            .metric(
                "agentloop_rpc_responses_total{service=\"agentloop.v1.OrchestratorService\",code=\"NOT_FOUND\"}",
            )
            .unwrap_or(0.0)
    };
    let before = not_found();
    assert_eq!(
        caller.get(unknown).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(not_found(), before + 1.0, "one NOT_FOUND answer counted");
    assert_eq!(
        caller.get("not-an-id").await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let no_goal = pb::StartInvocationRequest {
        goal: String::new(),
        ..start_request(LOOKUPS)
    };
    assert_eq!(
        caller.start(no_goal).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    // A watch of a running invocation from beyond its next event: refused at once.
    let mut stats = system.executor().watch_stats();
    let id = caller.start_script(SLEEPING).await;
    stats.wait_for(|s| s.sleeps_started == 1).await.unwrap();
    let beyond = match caller.watch(&id, 99).await {
        Ok(mut watch) => watch.next(&pool()).await.unwrap().unwrap_err(),
        Err(status) => status,
    };
    assert_eq!(beyond.code(), Code::OutOfRange, "{beyond:?}");
    caller.cancel(&id).await.unwrap();
    system.stop().await;
}

async fn tenants_and_roles_hold(via: Via) {
    let issuer = TokenIssuer::new(Alg::Es256);
    let keys = tempfile::tempdir().unwrap();
    let mut config = OrchestratorConfig::default();
    config.server.auth = issuer.write_key_source(keys.path());
    config.server.auth.all_tenants_role = Some("platform".into());
    let system = system(config).await;
    let alice = issuer.token("alice", "acme", &[]);
    let mallory = issuer.token("mallory", "other", &["approver"]);
    let mut as_alice = caller(&system, via, Some(&alice)).await;
    let mut as_mallory = caller(&system, via, Some(&mallory)).await;
    let mut anonymous = caller(&system, via, None).await;

    let (id, mut watch) = as_alice.start_waiting(APPROVE_THEN_FINAL).await;

    assert_eq!(
        anonymous.get(&id).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    // Another tenant's invocation does not exist for mallory, in any call.
    assert_eq!(
        as_mallory.get(&id).await.unwrap_err().code(),
        Code::NotFound
    );
    assert!(
        as_mallory
            .list_in(pb::InvocationState::Unspecified)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        as_mallory.watch(&id, 1).await.err().map(|s| s.code()),
        Some(Code::NotFound)
    );
    assert_eq!(
        as_mallory.effects(&id).await.unwrap_err().code(),
        Code::NotFound
    );
    // Naming alice's tenant does not widen what mallory reads.
    let acme = pb::ListInvocationsRequest {
        tenant: "acme".into(),
        ..Default::default()
    };
    assert_eq!(
        as_mallory.list(acme.clone()).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    assert_eq!(as_alice.list(acme).await.unwrap().len(), 1);
    let acme_stats = pb::GetInvocationStatsRequest {
        tenant: "acme".into(),
        ..Default::default()
    };
    assert_eq!(
        as_mallory.stats(acme_stats).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    assert_eq!(
        as_mallory
            .stats(Default::default())
            .await
            .unwrap()
            .invocations,
        0
    );
    let alices = as_alice.stats(Default::default()).await.unwrap();
    assert_eq!((alices.invocations, alices.waiting), (1, 1));
    // A platform operator (auth.all_tenants_role) reads every tenant, and narrows by one.
    let mut platform = caller(
        &system,
        via,
        Some(&issuer.token("olga", "platform-ops", &["platform"])),
    )
    .await;
    assert_eq!(platform.get(&id).await.unwrap().tenant, "acme");
    let everyone = platform
        .list_in(pb::InvocationState::Unspecified)
        .await
        .unwrap();
    assert_eq!(everyone.len(), 1);
    let of = |tenant: &str| pb::ListInvocationsRequest {
        tenant: tenant.into(),
        ..Default::default()
    };
    assert_eq!(platform.list(of("acme")).await.unwrap().len(), 1);
    assert!(platform.list(of("other")).await.unwrap().is_empty());
    assert_eq!(
        platform
            .stats(Default::default())
            .await
            .unwrap()
            .invocations,
        1
    );
    assert_eq!(platform.effects(&id).await.unwrap().len(), 0);
    let digest = as_alice
        .get(&id)
        .await
        .unwrap()
        .pending_approval
        .unwrap()
        .proposal_digest;
    // The approver is the caller: the request names no actor.
    let approve = pb::ResolveApprovalRequest {
        actor: String::new(),
        ..resolve_request(&id, &digest, pb::ApprovalVerdict::Approve)
    };
    assert_eq!(
        as_mallory
            .resolve(approve.clone())
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    // Alice sees her invocation, but approving needs the approver role.
    let refused = as_alice.resolve(approve.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(refused.message().contains("approver"), "{refused:?}");
    let mut approver = caller(
        &system,
        via,
        Some(&issuer.token("bob", "acme", &["approver"])),
    )
    .await;
    approver.resolve(approve).await.unwrap();
    let events = watch.until(&pool(), final_end).await;
    assert_eq!(ended(&events).reason(), pb::TerminalReason::Completed);
    assert_eq!(applied_for(system.executor(), &id).len(), 1);
    system.stop().await;
}

/// What HTTP refuses before the API sees a request, and what it serves beside the RPCs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_refuses_what_is_no_request_and_serves_its_openapi_document() {
    let system = system(OrchestratorConfig::default()).await;
    let base = system.stack().http_endpoint().unwrap();
    let client = reqwest::Client::new();

    let no_route = client
        .get(format!("{base}/v1/nothing"))
        .send()
        .await
        .unwrap();
    assert_eq!(no_route.status(), 404);
    let status: serde_json::Value = no_route.json().await.unwrap();
    assert_eq!(status["code"], 5);

    let wrong_method = client
        .delete(format!("{base}/v1/invocations"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);
    assert_eq!(wrong_method.headers()["allow"], "POST, GET");

    let unknown_field = client
        .post(format!("{base}/v1/invocations"))
        .body(r#"{"goal": "x", "notAField": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown_field.status(), 400);
    let status: serde_json::Value = unknown_field.json().await.unwrap();
    assert!(
        status["message"].as_str().unwrap().contains("notAField"),
        "{status}"
    );

    let huge = client
        .post(format!("{base}/v1/invocations"))
        .body(vec![b' '; agentloop_http::MAX_BODY_BYTES + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status(), 413);

    // Another site's page cannot start a run through the visitor's browser, nor reach the
    // loopback listener under a name it rebound to 127.0.0.1.
    let forged = client
        .post(format!("{base}/v1/invocations"))
        .header("origin", "http://evil.example")
        .body(r#"{"goal": "x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);
    let rebound = client
        .get(format!("{base}/v1/invocations"))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 403);

    // Nothing of the refused requests was started.
    let mut grpc = system.client().await;
    let listed = grpc
        .list_invocations(pb::ListInvocationsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.invocations.is_empty());

    let served: serde_json::Value = client
        .get(format!("{base}{}", agentloop_http::OPENAPI_PATH))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let committed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        served, committed,
        "the served document is the committed one"
    );

    // The console beside the API: its page and files, each under the content policy;
    // a path that is neither is the API's 404, and only GET serves a page.
    for (path, kind) in [("/", "text/html"), ("/console.js", "text/javascript")] {
        let page = client.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(page.status(), 200, "{path}");
        assert!(
            page.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with(kind)
        );
        assert_eq!(
            page.headers()["content-security-policy"],
            agentloop_console::POLICY
        );
    }
    let missing = client
        .get(format!("{base}/nothing.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let posted = client.post(format!("{base}/")).send().await.unwrap();
    assert_eq!(posted.status(), 404);
    system.stop().await;
}
