//! What the integration tests share: finding the reference servers (or skipping loudly),
//! calling an executor, waiting on its health, and a recording TCP proxy.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop_mcp::{Health, McpExecutor, McpServerConfig, Supervision};
use agentloop_proto::v1::tool_executor_service_server::ToolExecutorService;
use agentloop_proto::v1::tool_result::Outcome;
use agentloop_proto::v1::{
    DescribeRequest, ToolCall, ToolDescriptor, ToolError, ToolExecutorServiceExecuteRequest,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::Request;

/// Bound of every wait in these tests: servers start in a second or two, but CI has two
/// cores for everything.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Whether `program` is on `PATH`. When it is not, the test is skipped with a note on
/// stderr, unless `AGENTLOOP_REQUIRE_MCP=1` (as CI sets), which fails it.
pub fn available(program: &str, install: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()));
    if found {
        return true;
    }
    assert!(
        std::env::var("AGENTLOOP_REQUIRE_MCP").as_deref() != Ok("1"),
        "{program} is not installed and AGENTLOOP_REQUIRE_MCP=1; install it with: {install}"
    );
    eprintln!(
        "SKIPPED: {program} is not installed (install it with: {install}); \
         set AGENTLOOP_REQUIRE_MCP=1 to fail instead"
    );
    false
}

/// The fake server's script.
pub fn fake_server() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake_mcp_server.py")
}

/// An entry parsed from the registry's TOML, as a tool owner writes it.
pub fn config(toml_entry: &str) -> McpServerConfig {
    #[derive(serde::Deserialize)]
    struct Registry {
        mcp_servers: Vec<McpServerConfig>,
    }
    let registry: Registry = toml::from_str(&format!("[[mcp_servers]]\n{toml_entry}")).unwrap();
    registry.mcp_servers.into_iter().next().unwrap()
}

/// A stdio entry running the fake server in `mode`.
pub fn fake_config(name: &str, mode: &str) -> McpServerConfig {
    let script = fake_server();
    config(&format!(
        "name = {name:?}\ncommand = \"python3\"\nargs = [{:?}, {mode:?}]\ntimeout_ms = 20000",
        script.display().to_string()
    ))
}

/// Starts an executor that reads the test's own environment.
pub fn start(config: McpServerConfig, supervision: Supervision) -> Arc<McpExecutor> {
    McpExecutor::start_with(config, supervision, &|var| std::env::var(var).ok()).unwrap()
}

/// Waits until the executor's health satisfies `ready`.
pub async fn wait_for(
    executor: &McpExecutor,
    what: &str,
    ready: impl Fn(&Health) -> bool,
) -> Health {
    let mut health = executor.watch_health();
    let waited = tokio::time::timeout(PATIENCE, health.wait_for(|h| ready(h))).await;
    match waited {
        Ok(Ok(health)) => health.clone(),
        Ok(Err(_)) => panic!("the executor went away waiting for {what}"),
        Err(_) => panic!("no {what} within {PATIENCE:?}: {:?}", executor.health()),
    }
}

/// Waits until the server is up and returns the connection number.
pub async fn wait_up(executor: &McpExecutor) -> (u64, Option<u32>) {
    match wait_for(executor, "connection", Health::is_up).await {
        Health::Up { connection, pid } => (connection, pid),
        other => panic!("{other:?}"),
    }
}

pub async fn describe(executor: &McpExecutor) -> Vec<ToolDescriptor> {
    executor
        .describe(Request::new(DescribeRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .tools
}

/// The request for one call; `effect_key` is empty for a read.
pub fn call_request(
    tool: &str,
    arguments: serde_json::Value,
    effect_key: &str,
) -> Request<ToolExecutorServiceExecuteRequest> {
    Request::new(ToolExecutorServiceExecuteRequest {
        invocation_id: "inv-1".to_owned(),
        call: Some(ToolCall {
            call_id: "call-1".to_owned(),
            tool: tool.to_owned(),
            arguments_json: arguments.to_string(),
        }),
        effect_key: effect_key.to_owned(),
        attempt: 1,
        input_answer: None,
    })
}

/// Runs one call to its outcome, or the status it failed with.
pub async fn call(
    executor: &McpExecutor,
    tool: &str,
    arguments: serde_json::Value,
) -> Result<Outcome, tonic::Status> {
    let response = executor.execute(call_request(tool, arguments, "")).await?;
    let result = response.into_inner().result.unwrap();
    assert_eq!(result.call_id, "call-1");
    Ok(result.outcome.unwrap())
}

pub fn output(outcome: Outcome) -> serde_json::Value {
    match outcome {
        Outcome::Output(output) => serde_json::from_str(&output.output_json).unwrap(),
        other => panic!("expected an output, got {other:?}"),
    }
}

pub fn tool_error(outcome: Outcome) -> ToolError {
    match outcome {
        Outcome::Error(error) => error,
        other => panic!("expected a tool error, got {other:?}"),
    }
}

/// Polls `check` until it returns something, within [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {what} within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What one proxied TCP connection carried each way.
#[derive(Debug, Default, Clone)]
pub struct Transcript {
    pub sent: Vec<u8>,
    pub received: Vec<u8>,
}

/// A TCP proxy on a free loopback port to `upstream` that records every connection, so a
/// test can see what the client put on the wire and what the server answered.
pub struct RecordingProxy {
    pub port: u16,
    pub connections: Arc<Mutex<Vec<Arc<Mutex<Transcript>>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RecordingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RecordingProxy {
    pub async fn start(upstream: u16) -> RecordingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections: Arc<Mutex<Vec<Arc<Mutex<Transcript>>>>> = Arc::default();
        let recorded = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let transcript = Arc::new(Mutex::new(Transcript::default()));
                recorded.lock().unwrap().push(Arc::clone(&transcript));
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let sent = Arc::clone(&transcript);
                tokio::spawn(pipe(client_read, server_write, move |bytes| {
                    sent.lock().unwrap().sent.extend_from_slice(bytes);
                }));
                tokio::spawn(pipe(server_read, client_write, move |bytes| {
                    transcript.lock().unwrap().received.extend_from_slice(bytes);
                }));
            }
        });
        RecordingProxy {
            port,
            connections,
            task,
        }
    }

    pub fn transcripts(&self) -> Vec<Transcript> {
        self.connections
            .lock()
            .unwrap()
            .iter()
            .map(|t| t.lock().unwrap().clone())
            .collect()
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    record: impl Fn(&[u8]),
) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                record(&buffer[..n]);
                if to.write_all(&buffer[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}
