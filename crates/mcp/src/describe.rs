//! `tools/list` as the gateway's `Describe`: paging with bounds, and each MCP tool as a
//! [`ToolDescriptor`].
//!
//! What a server says about its tools is untrusted (the MCP specification calls the
//! annotations hints). So its lists are bounded, a tool that cannot be offered safely is
//! left out with a warning instead of failing the whole server, and the side-effect
//! class leans on the registry: only the registry's `idempotent` list makes a tool an
//! idempotent write, and a tool is read-only only if the server says so and the registry
//! does not list it as a write.

use std::time::Duration;

use agentloop_proto::v1::{SideEffect, ToolDescriptor};
use rmcp::RoleClient;
use rmcp::model::{PaginatedRequestParams, Tool};
use rmcp::service::{Peer, ServiceError};

use crate::names;

/// Most tools one server may list; a longer list is a misbehaving server.
pub const MAX_TOOLS: usize = 256;
/// Largest input schema of one tool, in bytes of JSON; a tool with a larger one is left
/// out (the gateway refuses larger schemas too).
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;
/// Longest description, in bytes; a longer one is cut (it goes into every prompt).
pub const MAX_DESCRIPTION_BYTES: usize = 16 * 1024;
/// Most pages of one listing: a server that keeps handing out cursors is cut off.
pub const MAX_PAGES: usize = 64;

/// Why a listing was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ListError {
    /// The request failed (transport, protocol or server error).
    #[error("tools/list failed: {0}")]
    Service(#[from] ServiceError),
    /// More than [`MAX_TOOLS`] tools.
    #[error("it lists more than {MAX_TOOLS} tools")]
    TooManyTools,
    /// More than [`MAX_PAGES`] pages.
    #[error("its tool list goes on for more than {MAX_PAGES} pages")]
    TooManyPages,
}

impl ListError {
    /// Whether the server broke a bound (rather than failing to answer).
    pub(crate) fn is_violation(&self) -> bool {
        match self {
            ListError::Service(_) => false,
            ListError::TooManyTools | ListError::TooManyPages => true,
        }
    }
}

/// Every tool the server lists, following `nextCursor` within the bounds.
pub(crate) async fn list_all(peer: &Peer<RoleClient>) -> Result<Vec<Tool>, ListError> {
    let mut tools = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_PAGES {
        let params =
            cursor.map(|cursor| PaginatedRequestParams::default().with_cursor(Some(cursor)));
        let page = peer.list_tools(params).await?;
        if tools.len() + page.tools.len() > MAX_TOOLS {
            return Err(ListError::TooManyTools);
        }
        tools.extend(page.tools);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(tools),
        }
    }
    Err(ListError::TooManyPages)
}

/// Why a listed tool is not offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Skip {
    /// Its name does not fit a model's function name under the server's prefix.
    Name,
    /// Its input schema is larger than [`MAX_SCHEMA_BYTES`] (or cannot be encoded).
    Schema,
    /// An earlier tool of the listing has the same name.
    Duplicate,
}

/// The descriptors of `tools` of `server`, in the order listed, with the tools left out
/// and why (each is also logged as a warning naming the server).
pub(crate) fn descriptors(
    server: &str,
    idempotent: &[String],
    timeout: Duration,
    tools: &[Tool],
) -> (Vec<ToolDescriptor>, Vec<(String, Skip)>) {
    let mut offered: Vec<ToolDescriptor> = Vec::with_capacity(tools.len());
    let mut skipped = Vec::new();
    for tool in tools {
        let own = tool.name.as_ref();
        match descriptor(server, idempotent, timeout, tool) {
            Ok(descriptor) if offered.iter().any(|d| d.name == descriptor.name) => {
                skipped.push((own.to_owned(), Skip::Duplicate));
            }
            Ok(descriptor) => offered.push(descriptor),
            Err(skip) => skipped.push((own.to_owned(), skip)),
        }
    }
    for (tool, skip) in &skipped {
        let tool = agentloop_proto::prefix(tool, 128);
        tracing::warn!(server, tool, ?skip, "MCP tool not offered");
    }
    (offered, skipped)
}

fn descriptor(
    server: &str,
    idempotent: &[String],
    timeout: Duration,
    tool: &Tool,
) -> Result<ToolDescriptor, Skip> {
    let own = tool.name.as_ref();
    let name = names::qualified(server, own).ok_or(Skip::Name)?;
    let input_schema_json =
        serde_json::to_string(tool.input_schema.as_ref()).map_err(|_| Skip::Schema)?;
    if input_schema_json.len() > MAX_SCHEMA_BYTES {
        return Err(Skip::Schema);
    }
    let description = tool
        .description
        .as_deref()
        .or(tool.title.as_deref())
        .unwrap_or_default();
    let side_effect = side_effect(server, own, tool, idempotent);
    Ok(ToolDescriptor {
        name,
        description: agentloop_proto::prefix(description, MAX_DESCRIPTION_BYTES).to_owned(),
        input_schema_json,
        side_effect: side_effect as i32,
        timeout: Some(prost_types::Duration {
            seconds: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(timeout.subsec_nanos()).unwrap_or(0),
        }),
        ..ToolDescriptor::default()
    })
}

/// The registry's `idempotent` list first: a tool it lists is an idempotent write even if
/// the server hints read-only, because the registry is the tool owner's word and the
/// stricter class is the safe one. Otherwise the server's `readOnlyHint` makes a read,
/// and anything else is a plain write. The server's `idempotentHint` is logged, never
/// trusted: only the registry may allow a second send.
fn side_effect(server: &str, own: &str, tool: &Tool, idempotent: &[String]) -> SideEffect {
    let hints = tool.annotations.as_ref();
    let read_only_hint = hints.and_then(|a| a.read_only_hint);
    let idempotent_hint = hints.and_then(|a| a.idempotent_hint);
    let class = if idempotent.iter().any(|listed| listed == own) {
        SideEffect::IdempotentWrite
    } else if read_only_hint == Some(true) {
        SideEffect::ReadOnly
    } else {
        SideEffect::Write
    };
    tracing::info!(
        server,
        tool = own,
        ?read_only_hint,
        ?idempotent_hint,
        side_effect = class.as_str_name(),
        "MCP tool offered"
    );
    class
}

#[cfg(test)]
mod tests {

    use std::sync::Arc;

    use rmcp::model::ToolAnnotations;

    use super::*;

    fn tool(name: &str, annotations: Option<ToolAnnotations>) -> Tool {
        let schema = serde_json::json!({"type": "object", "properties": {"x": {"type": "string"}}});
        let mut tool = Tool::new(
            name.to_owned(),
            format!("does {name}"),
            Arc::new(schema.as_object().unwrap().clone()),
        );
        tool.annotations = annotations;
        tool
    }

    #[test]
    fn tools_are_offered_under_the_prefix_with_schema_timeout_and_class() {
        let read = ToolAnnotations::new().read_only(true).idempotent(true);
        let tools = [
            tool("get", Some(read.clone())),
            tool("put", Some(ToolAnnotations::new().idempotent(true))),
            tool("set", None),
            tool("listed_read", Some(read)),
        ];
        let idempotent = vec!["set".to_owned(), "listed_read".to_owned()];
        let (offered, skipped) =
            descriptors("srv", &idempotent, Duration::from_millis(1500), &tools);
        assert!(skipped.is_empty());
        let classes: Vec<(&str, i32)> = offered
            .iter()
            .map(|d| (d.name.as_str(), d.side_effect))
            .collect();
        assert_eq!(
            classes,
            [
                ("srv__get", SideEffect::ReadOnly as i32),
                // The server's idempotentHint alone does not allow a second send.
                ("srv__put", SideEffect::Write as i32),
                ("srv__set", SideEffect::IdempotentWrite as i32),
                // The registry's word wins over the server's read-only hint.
                ("srv__listed_read", SideEffect::IdempotentWrite as i32),
            ]
        );
        let get = &offered[0];
        assert_eq!(get.description, "does get");
        let schema: serde_json::Value = serde_json::from_str(&get.input_schema_json).unwrap();
        assert_eq!(schema["properties"]["x"]["type"], "string");
        assert_eq!(
            get.timeout,
            Some(prost_types::Duration {
                seconds: 1,
                nanos: 500_000_000
            })
        );
    }

    #[test]
    fn tools_that_cannot_be_offered_are_left_out() {
        let mut big = tool("big", None);
        let huge =
            serde_json::json!({"type": "object", "description": "x".repeat(MAX_SCHEMA_BYTES)});
        big.input_schema = Arc::new(huge.as_object().unwrap().clone());
        let mut long = tool("long", None);
        long.description = Some("é".repeat(MAX_DESCRIPTION_BYTES).into());
        let tools = [
            tool("a.b", None),
            big,
            tool("ok", None),
            tool("ok", None),
            long,
        ];
        let (offered, skipped) = descriptors("srv", &[], Duration::from_secs(1), &tools);
        let names: Vec<&str> = offered.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["srv__ok", "srv__long"]);
        assert_eq!(
            skipped,
            [
                ("a.b".to_owned(), Skip::Name),
                ("big".to_owned(), Skip::Schema),
                ("ok".to_owned(), Skip::Duplicate),
            ]
        );
        // Cut at a character boundary, within the bound.
        assert!(offered[1].description.len() <= MAX_DESCRIPTION_BYTES);
        assert!(offered[1].description.chars().all(|c| c == 'é'));
    }
}
