//! Harness of the end-to-end tests: the whole of agentloop, either as separate gRPC
//! servers on loopback ports (each service in its own tonic server, talking gRPC to the
//! others, exactly as deployed) or as the embedded in-process stack of `agentloop dev`.
//! Both give an orchestrator endpoint, so every scenario runs against both.
#![warn(missing_docs)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)] // test support

use std::time::Duration;

use agentloop_demo_executor::{AppliedTransfer, DemoExecutor, read_record};
use agentloop_orchestrator::OrchestratorConfig;
use agentloop_proto::client::Transport;
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::effect_ledger_service_client::EffectLedgerServiceClient;
use agentloop_proto::v1::orchestrator_service_client::OrchestratorServiceClient;
use agentloop_stack::{ServiceTelemetry, ServicesOptions, Stack, StackOptions};
use agentloop_telemetry::Telemetry;
use futures::StreamExt;
use tempfile::TempDir;
use tonic::{Status, Streaming};

/// A client of the orchestrator.
pub type Client = OrchestratorServiceClient<Transport>;

/// The two ways of running agentloop that every scenario is checked against.
pub use agentloop_stack::Wiring;

/// Runs each named `async fn scenario(wiring: Wiring)` of the calling test file as two
/// tests, `scenario::distributed` and `scenario::embedded`.
#[macro_export]
macro_rules! both_wirings {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn distributed() {
                    super::$name($crate::Wiring::Distributed).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn embedded() {
                    super::$name($crate::Wiring::Embedded).await;
                }
            }
        )*
    };
}

/// A running deployment, stopped gracefully by [`System::stop`].
#[derive(Debug)]
pub struct System {
    stack: Stack,
    telemetry: Telemetry,
    _dir: TempDir,
}

async fn channel(endpoint: &str) -> Transport {
    agentloop_stack::channel(endpoint).await.unwrap()
}

impl System {
    /// Starts agentloop wired as asked, with the orchestrator configured by `config`.
    pub async fn start(wiring: Wiring, config: OrchestratorConfig) -> System {
        System::start_with(wiring, config, |_| {}).await
    }

    /// [`System::start`], with the other services' options changed by `configure`.
    pub async fn start_with(
        wiring: Wiring,
        config: OrchestratorConfig,
        configure: impl FnOnce(&mut ServicesOptions),
    ) -> System {
        agentloop_server::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        // One registry for every service, so a test reads all of their metrics at once.
        let telemetry = Telemetry::off();
        let mut options = StackOptions {
            wiring,
            orchestrator: config,
            telemetry: telemetry.clone(),
            ..StackOptions::embedded(dir.path().join("data"))
        };
        options.services.telemetry = ServiceTelemetry::shared(&telemetry);
        configure(&mut options.services);
        let stack = Stack::start(options).await.unwrap();
        System {
            stack,
            telemetry,
            _dir: dir,
        }
    }

    /// The value of the metric sample `series` (`name{labels}` as the text format prints
    /// it) across every service; `None` when no such sample is recorded.
    pub fn metric(&self, series: &str) -> Option<f64> {
        agentloop_telemetry::metrics::sample(&self.telemetry.metrics().encode(), series)
    }

    /// The demo executor, to observe what tools saw.
    pub fn executor(&self) -> &DemoExecutor {
        self.stack.demo_executor()
    }

    /// A client of the orchestrator.
    pub async fn client(&self) -> OrchestratorServiceClient<Transport> {
        client_of(&self.stack).await
    }

    /// A client of the effect ledger, as the orchestrator reaches it (with its service
    /// token): only the distributed wiring serves the ledger on a port.
    pub async fn ledger(&self) -> Option<EffectLedgerServiceClient<Transport>> {
        let endpoints = self.stack.endpoints()?;
        let transport =
            agentloop_stack::channel_as(&endpoints.ledger, Some(&endpoints.tokens.orchestrator))
                .await
                .unwrap();
        Some(agentloop_proto::client::effect_ledger(transport))
    }

    /// The running stack.
    pub fn stack(&self) -> &Stack {
        &self.stack
    }

    /// Graceful stop of every server.
    pub async fn stop(self) {
        self.stack.stop().await.unwrap();
    }
}

/// A client of the orchestrator of `stack` (for a test that starts and stops a [`Stack`]
/// of its own).
pub async fn client_of(stack: &Stack) -> OrchestratorServiceClient<Transport> {
    agentloop_proto::client::orchestrator(channel(&stack.endpoint()).await)
}

/// A scripted-model start request.
pub fn start_request(script: &str) -> pb::StartInvocationRequest {
    pb::StartInvocationRequest {
        goal: "end-to-end scenario".into(),
        scripted_model_json: script.into(),
        ..Default::default()
    }
}

/// Starts an invocation; returns its ID.
pub async fn start(
    client: &mut OrchestratorServiceClient<Transport>,
    request: pb::StartInvocationRequest,
) -> String {
    client
        .start_invocation(request)
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap()
        .invocation_id
}

/// Every committed event from `from_seq` to the end.
pub async fn events_until_end(
    client: &mut OrchestratorServiceClient<Transport>,
    id: &str,
    from_seq: u64,
) -> Vec<pb::Event> {
    let mut stream = client
        .watch_invocation(pb::WatchInvocationRequest {
            invocation_id: id.into(),
            from_seq,
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(item) = stream.next().await {
        events.push(item.unwrap().event.unwrap());
    }
    events
}

/// The invocation as the orchestrator reports it now.
pub async fn get(client: &mut OrchestratorServiceClient<Transport>, id: &str) -> pb::Invocation {
    client
        .get_invocation(pb::GetInvocationRequest {
            invocation_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap()
}

/// Runs a script to its end; returns the ended invocation and its events.
pub async fn run_to_end(
    client: &mut OrchestratorServiceClient<Transport>,
    request: pb::StartInvocationRequest,
) -> (pb::Invocation, Vec<pb::Event>) {
    let id = start(client, request).await;
    let events = events_until_end(client, &id, 1).await;
    (get(client, &id).await, events)
}

/// The effect-ledger entries of invocation `id`, as the orchestrator's API lists them.
pub async fn effects(
    client: &mut OrchestratorServiceClient<Transport>,
    id: &str,
) -> Vec<pb::EffectEntry> {
    client
        .list_effects(pb::ListEffectsRequest {
            invocation_id: id.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries
}

/// The terminal reason of an invocation.
pub fn reason(invocation: &pb::Invocation) -> pb::TerminalReason {
    invocation.terminal_reason()
}

/// The turn events of a log.
pub fn turns(events: &[pb::Event]) -> Vec<&pb::TurnCommitted> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            Some(pb::event::Body::Turn(turn)) => Some(turn),
            _ => None,
        })
        .collect()
}

/// Bounds every wait of a test on the orchestrator, so a lost invocation fails the test
/// instead of hanging it.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Reads `stream` up to and including the `Ended` event that waits for a human.
pub async fn read_until_waiting(
    stream: &mut Streaming<pb::WatchInvocationResponse>,
) -> (Vec<pb::Event>, pb::InvocationEnded) {
    let mut events = Vec::new();
    let read = async {
        while let Some(item) = stream.next().await {
            let event = item.unwrap().event.unwrap();
            events.push(event.clone());
            if let Some(pb::event::Body::Ended(end)) = event.body {
                assert!(
                    end.wait_until.is_some(),
                    "the run ended for good instead of waiting: {end:?}"
                );
                return end;
            }
        }
        panic!("the stream ended before the invocation waited: {events:?}");
    };
    let end = tokio::time::timeout(PATIENCE, read)
        .await
        .expect("the invocation never waited");
    (events, end)
}

/// A watch of `id` from `from_seq`.
pub async fn watch_from(
    client: &mut Client,
    id: &str,
    from_seq: u64,
) -> Result<Streaming<pb::WatchInvocationResponse>, Status> {
    Ok(client
        .watch_invocation(pb::WatchInvocationRequest {
            invocation_id: id.into(),
            from_seq,
        })
        .await?
        .into_inner())
}

/// A watch of `id` from its first event.
pub async fn watch(client: &mut Client, id: &str) -> Streaming<pb::WatchInvocationResponse> {
    watch_from(client, id, 1).await.unwrap()
}

/// Starts `request` and reads it until it waits: its ID, its events up to the waiting
/// end, and that end.
pub async fn start_waiting(
    client: &mut Client,
    request: pb::StartInvocationRequest,
) -> (String, Vec<pb::Event>, pb::InvocationEnded) {
    let id = start(client, request).await;
    let (events, end) = read_until_waiting(&mut watch(client, &id).await).await;
    (id, events, end)
}

/// Every event of `id` up to its final end (bounded).
pub async fn events_until_final_end(client: &mut Client, id: &str) -> Vec<pb::Event> {
    tokio::time::timeout(PATIENCE, events_until_end(client, id, 1))
        .await
        .expect("the invocation never ended")
}

/// A resolve of `id`'s proposal `digest` by `approver-1`.
pub fn resolve_request(
    id: &str,
    digest: &str,
    verdict: pb::ApprovalVerdict,
) -> pb::ResolveApprovalRequest {
    pb::ResolveApprovalRequest {
        invocation_id: id.into(),
        proposal_digest: digest.into(),
        verdict: verdict.into(),
        actor: "approver-1".into(),
        comment: String::new(),
    }
}

/// Resolves as `request` says; the invocation it resumed.
pub async fn resolve(
    client: &mut Client,
    request: pb::ResolveApprovalRequest,
) -> Result<pb::Invocation, Status> {
    Ok(client
        .resolve_approval(request)
        .await?
        .into_inner()
        .invocation
        .unwrap())
}

/// Approves `digest` of `id` as `approver-1`.
pub async fn approve(
    client: &mut Client,
    id: &str,
    digest: &str,
) -> Result<pb::Invocation, Status> {
    resolve(
        client,
        resolve_request(id, digest, pb::ApprovalVerdict::Approve),
    )
    .await
}

/// The transfers the executor applied for invocation `id`, from its own durable record.
pub fn applied_for(executor: &DemoExecutor, id: &str) -> Vec<AppliedTransfer> {
    read_record(executor.data_dir())
        .unwrap()
        .into_iter()
        .filter(|transfer| transfer.invocation_id == id)
        .collect()
}

/// The folder of the service binaries: the workspace's, next to the running test's own
/// (`cargo test --workspace` builds them), or the one `AGENTLOOP_BIN_DIR` names.
///
/// # Panics
///
/// When the test's own path has no such folder.
pub fn bin_dir() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("AGENTLOOP_BIN_DIR") {
        return std::path::PathBuf::from(dir);
    }
    // target/<profile>/deps/<this test> -> target/<profile>
    let exe = std::env::current_exe().expect("the test's own path");
    exe.parent()
        .and_then(std::path::Path::parent)
        .expect("the test runs from target/<profile>/deps")
        .to_path_buf()
}

/// Whether the MCP server `program` is on `PATH`. When it is not, the test skips, saying
/// so on stderr, unless `AGENTLOOP_REQUIRE_MCP=1` (CI sets it), which makes that a
/// failure.
pub fn mcp_server_installed(program: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()));
    if !found {
        assert!(
            std::env::var("AGENTLOOP_REQUIRE_MCP").as_deref() != Ok("1"),
            "{program} is not installed and AGENTLOOP_REQUIRE_MCP=1"
        );
        // Straight to stderr: the harness hides eprintln! of a passing test.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {program} is not on PATH; set AGENTLOOP_REQUIRE_MCP=1 to fail instead"
        );
    }
    found
}
