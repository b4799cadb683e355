//! The MCP client side of a connection: what this gateway tells servers about itself
//! and what it does with their notifications.
//!
//! It declares no capabilities: the gateway answers no sampling, roots or elicitation
//! requests (rmcp refuses them for it), because a server must not reach the model or a
//! user behind the tool owner's back.

// Logging (`notifications/message`) is deprecated by SEP-2577 for the 2026 protocol, but
// servers of the versions in use today send it, and it is what they say to operators.
#![expect(
    deprecated,
    reason = "servers of current protocol versions still log this way"
)]

use std::sync::{Arc, Mutex};

use rmcp::ClientHandler;
use rmcp::RoleClient;
use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, LoggingLevel,
    LoggingMessageNotificationParam, ProtocolVersion,
};
use rmcp::service::NotificationContext;

use crate::logs::{Admit, Budget, MAX_LINE_BYTES};

/// One connection's handler; logs under the server's name.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    server: Arc<str>,
    budget: Arc<Mutex<Budget>>,
}

impl Client {
    pub(crate) fn new(server: Arc<str>) -> Client {
        Client {
            server,
            budget: Arc::new(Mutex::new(Budget::new(tokio::time::Instant::now()))),
        }
    }

    fn admit(&self) -> Admit {
        // A poisoned lock only means another log line panicked; the count is still good.
        let mut budget = self
            .budget
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        budget.admit(tokio::time::Instant::now())
    }
}

impl ClientHandler for Client {
    /// Offers the newest version that has the `initialize` handshake (rmcp's default is
    /// the newest of all, 2026-07-28, which has none): every server in use today speaks
    /// it, and one that answers with a stateless version is followed there by rmcp.
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("agentloop", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let Admit::Yes { dropped } = self.admit() else {
            return;
        };
        let data = params.data.to_string();
        let data = agentloop_proto::prefix(&data, MAX_LINE_BYTES);
        let server = &*self.server;
        let logger = params.logger.as_deref().unwrap_or_default();
        let logger = agentloop_proto::prefix(logger, 128);
        match params.level {
            LoggingLevel::Debug => {
                tracing::debug!(server, logger, dropped_before = dropped, "log: {data}");
            }
            LoggingLevel::Info | LoggingLevel::Notice => {
                tracing::info!(server, logger, dropped_before = dropped, "log: {data}");
            }
            LoggingLevel::Warning => {
                tracing::warn!(server, logger, dropped_before = dropped, "log: {data}");
            }
            LoggingLevel::Error
            | LoggingLevel::Critical
            | LoggingLevel::Alert
            | LoggingLevel::Emergency => {
                tracing::error!(server, logger, dropped_before = dropped, "log: {data}");
            }
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        // The gateway's registry is what the model sees; it follows on its next Describe.
        tracing::info!(
            server = &*self.server,
            "MCP server says its tool list changed"
        );
    }
}
