//! One live connection to a server, as calls see it: its peer and why it ended.

use std::sync::{Arc, OnceLock};

use rmcp::RoleClient;
use rmcp::service::Peer;
use tokio_util::sync::CancellationToken;

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultKind {
    /// The server broke the protocol or a bound (garbage, an oversized message, too
    /// many tools): it was cut off. Sending the same thing again gets the same answer.
    Violation,
    /// The server went away (exited, closed its stream, stopped answering).
    Lost,
}

/// Why a connection ended, recorded once by whoever noticed first (the transport, a
/// call, the supervisor), and the signal that ends it.
#[derive(Debug, Default)]
pub(crate) struct Fault {
    first: OnceLock<(FaultKind, String)>,
    cut: CancellationToken,
}

impl Fault {
    /// The server broke the protocol: record why (logged as an error naming the server)
    /// and cut the connection.
    pub(crate) fn violation(&self, server: &str, reason: String) {
        let reason = agentloop_proto::bounded_message(reason);
        tracing::error!(server, %reason, "MCP server misbehaved and is cut off");
        self.record(FaultKind::Violation, reason);
    }

    /// The server went away: record why (unless something was recorded first) and end
    /// the connection.
    pub(crate) fn lost(&self, reason: String) {
        self.record(FaultKind::Lost, agentloop_proto::bounded_message(reason));
    }

    fn record(&self, kind: FaultKind, reason: String) {
        // Only the first reason counts: later ones are consequences of it.
        let _ = self.first.set((kind, reason));
        self.cut.cancel();
    }

    /// What was recorded, if anything.
    pub(crate) fn get(&self) -> Option<&(FaultKind, String)> {
        self.first.get()
    }

    /// Resolves once the connection is to end.
    pub(crate) async fn cut(&self) {
        self.cut.cancelled().await;
    }
}

/// What calls need of the current connection. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    pub(crate) peer: Peer<RoleClient>,
    pub(crate) fault: Arc<Fault>,
}

#[cfg(test)]
mod tests {

    use super::*;

    #[tokio::test]
    async fn the_first_reason_is_kept_and_cuts_the_connection() {
        let fault = Fault::default();
        assert!(fault.get().is_none());
        fault.violation("s", "sent garbage".to_owned());
        fault.lost("exited".to_owned());
        assert_eq!(
            fault.get().unwrap(),
            &(FaultKind::Violation, "sent garbage".to_owned())
        );
        // Already cut: resolves at once.
        fault.cut().await;
    }
}
