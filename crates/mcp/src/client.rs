//! The MCP client side of a connection: what this gateway tells servers about itself
//! and what it does with their notifications.
//!
//! It declares one capability, form elicitation (unless the entry declines questions): a
//! server's question for a person becomes the invocation's wait for an answer
//! (`crate::elicit`). It answers no sampling or roots requests (rmcp refuses them for
//! it), because a server must not reach the model behind the tool owner's back.

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
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationCapability, ErrorData, FormElicitationCapability, Implementation, LoggingLevel,
    LoggingMessageNotificationParam, ProtocolVersion,
};
use rmcp::service::{InboundStreamOrigin, NotificationContext, RequestContext};

use crate::elicit::Questions;
use crate::logs::{Admit, Budget, MAX_LINE_BYTES};

/// One connection's handler; logs under the server's name, and answers its questions
/// for the calls in flight.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    server: Arc<str>,
    budget: Arc<Mutex<Budget>>,
    questions: Arc<Questions>,
}

impl Client {
    pub(crate) fn new(server: Arc<str>, questions: Arc<Questions>) -> Client {
        Client {
            server,
            budget: Arc::new(Mutex::new(Budget::new(tokio::time::Instant::now()))),
            questions,
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
        let mut capabilities = ClientCapabilities::default();
        if self.questions.declared() {
            // Forms only: a URL question sends a person to a page the gateway cannot
            // show, and the orchestrator checks answers against the form's schema.
            let mut elicitation = ElicitationCapability::default();
            elicitation.form = Some(FormElicitationCapability::new().with_schema_validation(true));
            capabilities.elicitation = Some(elicitation);
        }
        ClientConfig::new(
            capabilities,
            Implementation::new("agentloop", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        match request {
            ElicitRequestParams::FormElicitationParams {
                message,
                requested_schema,
                ..
            } => {
                let schema = serde_json::to_value(&requested_schema).unwrap_or_default();
                // The POST whose response stream carried it, over streamable HTTP.
                let origin = match context.extensions.get::<InboundStreamOrigin>() {
                    Some(InboundStreamOrigin::OutboundRequest(id)) => Some(id),
                    Some(InboundStreamOrigin::Unassociated) | None => None,
                };
                Ok(self.questions.answer(&message, &schema, origin))
            }
            // A URL question, or a kind newer than this gateway: not one it can show.
            ElicitRequestParams::UrlElicitationParams { .. } | _ => {
                Ok(ElicitResult::new(ElicitationAction::Decline))
            }
        }
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
