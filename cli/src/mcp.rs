//! `agentloop mcp login`: authorizes the gateway, once, for an MCP server that wants a
//! user's consent. The flow is `agentloop_mcp::login`'s; this prints and exits.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use agentloop_tools::ToolsConfig;

use crate::exit;

/// Logs in to the server named `server` of the registry at `tools`.
pub(crate) async fn login(
    server: &str,
    tools: &Path,
    listen: SocketAddr,
    wait: Duration,
) -> anyhow::Result<u8> {
    let registry = ToolsConfig::load(tools)?;
    let Some(entry) = registry
        .mcp_servers
        .iter()
        .find(|entry| entry.name == server)
    else {
        eprintln!(
            "{}: no [[mcp_servers]] entry is named {server:?}",
            tools.display()
        );
        return Ok(exit::BAD_CONFIG);
    };
    let show = |url: &str| {
        eprintln!(
            "Open this URL in a browser to authorize agentloop for the MCP server {server:?}:"
        );
        println!("{url}");
    };
    let lookup = |var: &str| std::env::var(var).ok();
    match agentloop_mcp::login(entry, &lookup, listen, wait, show).await {
        Ok(login) => {
            eprintln!(
                "Authorized as client {:?}; the tokens are in {} (keep it secret).",
                login.client_id,
                login.token_file.display()
            );
            Ok(0)
        }
        Err(
            error @ (agentloop_mcp::McpLoginError::Config(_)
            | agentloop_mcp::McpLoginError::NotLogin(_)),
        ) => {
            eprintln!("{error}");
            Ok(exit::BAD_CONFIG)
        }
        Err(error) => {
            eprintln!("{error}");
            Ok(exit::FAILURE)
        }
    }
}
