//! Against the reference server `@modelcontextprotocol/server-everything` (npm: `npm
//! install -g @modelcontextprotocol/server-everything`) over streamable HTTP, run as its
//! README says (`mcp-server-everything streamableHttp`, on the port in `PORT`), behind a
//! recording proxy so the tests see what went over the wire.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

mod common;

use std::process::Stdio;
use std::sync::Arc;

use agentloop_mcp::{McpExecutor, Supervision};
use agentloop_proto::v1::SideEffect;
use agentloop_proto::v1::tool_result::Outcome;
use common::*;
use serde_json::json;

const INSTALL: &str = "npm install -g @modelcontextprotocol/server-everything";
const TOKEN: &str = "s3cret-token";

/// The server, killed when dropped, and a proxy in front of it.
struct Everything {
    _server: tokio::process::Child,
    proxy: RecordingProxy,
}

async fn everything() -> Option<Everything> {
    if !available("mcp-server-everything", INSTALL) {
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = tokio::process::Command::new("mcp-server-everything")
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            server.try_wait().unwrap().is_none(),
            "server-everything exited"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "server-everything is not listening"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let proxy = RecordingProxy::start(port).await;
    Some(Everything {
        _server: server,
        proxy,
    })
}

fn start_executor(everything: &Everything) -> Arc<McpExecutor> {
    let config = config(&format!(
        "name = \"everything\"\nurl = \"http://127.0.0.1:{}/mcp\"\nheaders = {{ X-Team = \"a\" }}\n\
         bearer_token_env = \"EVERYTHING_TOKEN\"\ntimeout_ms = 20000",
        everything.proxy.port
    ));
    let env = |var: &str| (var == "EVERYTHING_TOKEN").then(|| TOKEN.to_owned());
    McpExecutor::start_with(config, Supervision::default(), &env).unwrap()
}

/// The JSON-RPC messages a connection carried one way (bodies and SSE events alike).
fn messages(bytes: &[u8]) -> Vec<serde_json::Value> {
    let text = String::from_utf8_lossy(bytes);
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(start) = text[at..].find('{').map(|i| at + i) {
        let mut values =
            serde_json::Deserializer::from_str(&text[start..]).into_iter::<serde_json::Value>();
        match values.next() {
            Some(Ok(value)) if value.get("jsonrpc").is_some() => {
                found.push(value);
                at = start + values.byte_offset();
            }
            _ => at = start + 1,
        }
    }
    found
}

fn with_method<'a>(
    messages: &'a [serde_json::Value],
    method: &str,
) -> Option<&'a serde_json::Value> {
    messages.iter().find(|m| m["method"] == method)
}

#[tokio::test]
async fn its_tools_are_described_and_called_with_the_configured_headers() {
    let Some(everything) = everything().await else {
        return;
    };
    let executor = start_executor(&everything);
    let tools = describe(&executor).await;
    let echo = tools
        .iter()
        .find(|t| t.name == "everything__echo")
        .unwrap_or_else(|| panic!("no everything__echo in {tools:?}"));
    assert_eq!(echo.side_effect, SideEffect::ReadOnly as i32);
    let schema: serde_json::Value = serde_json::from_str(&echo.input_schema_json).unwrap();
    assert_eq!(schema["properties"]["message"]["type"], "string");
    assert!(
        tools
            .iter()
            .any(|t| t.name == "everything__trigger-long-running-operation")
    );

    let echoed = output(
        call(&executor, "everything__echo", json!({"message": "hi"}))
            .await
            .unwrap(),
    );
    assert_eq!(echoed, "Echo: hi");
    // Arguments that break the schema come back as a tool error, not a failure.
    let refused = call(&executor, "everything__echo", json!({}))
        .await
        .unwrap();
    assert!(matches!(refused, Outcome::Error(_)), "{refused:?}");

    // Every request carried the headers of the registry and the token from the env.
    let transcripts = everything.proxy.transcripts();
    assert!(!transcripts.is_empty());
    for transcript in &transcripts {
        let sent = String::from_utf8_lossy(&transcript.sent).to_lowercase();
        assert!(
            sent.contains(&format!("authorization: bearer {TOKEN}")),
            "{sent}"
        );
        assert!(sent.contains("x-team: a"), "{sent}");
    }
    // The token is read at start and never shown.
    assert!(!format!("{executor:?}").contains(TOKEN));
    executor.shutdown().await;
}

#[tokio::test]
async fn a_long_call_whose_future_is_dropped_is_cancelled_at_the_server() {
    let Some(everything) = everything().await else {
        return;
    };
    let executor = start_executor(&everything);
    wait_up(&executor).await;
    let running = {
        let executor = Arc::clone(&executor);
        tokio::spawn(async move {
            call(
                &executor,
                "everything__trigger-long-running-operation",
                json!({"duration": 120, "steps": 1200}),
            )
            .await
        })
    };
    // The server runs the call: it reports progress on the call's stream.
    let id = eventually("the call running at the server", || async {
        everything.proxy.transcripts().iter().find_map(|t| {
            let sent = messages(&t.sent);
            let request = with_method(&sent, "tools/call")?;
            with_method(&messages(&t.received), "notifications/progress")?;
            Some(request["id"].clone())
        })
    })
    .await;
    // The caller goes away.
    running.abort();
    // The server is told to cancel exactly that request, and accepts it.
    let accepted = eventually("the cancellation at the server", || async {
        everything.proxy.transcripts().iter().find_map(|t| {
            let sent = messages(&t.sent);
            let cancelled = with_method(&sent, "notifications/cancelled")?;
            (cancelled["params"]["requestId"] == id)
                .then(|| String::from_utf8_lossy(&t.received).into_owned())
        })
    })
    .await;
    assert!(accepted.starts_with("HTTP/1.1 202"), "{accepted}");
    executor.shutdown().await;
}
