//! The one error type of the demo executor and its one mapping to `tonic::Status`.

use std::path::PathBuf;

/// Why the demo executor could not start or could not serve a request.
///
/// Tool failures a model should see (a bad argument, an unknown lookup key) are *not*
/// errors here: they are `ToolResult`s with a structured `ToolError`, as the contract
/// asks. These are failures of the executor or of the request itself, which the caller
/// sees as a gRPC status (see the `From<DemoError> for tonic::Status` impl).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// A file or directory of the executor could not be read or written.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done (e.g. "cannot open the effect record").
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A complete line of the effect record is not a valid entry. A torn *last* line is
    /// expected after a crash and ignored; a bad line before it means the file was
    /// damaged, and starting anyway could forget an applied effect.
    #[error("effect record {} is corrupt at line {line}: {reason}", path.display())]
    CorruptRecord {
        /// The record file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The lookup data file is not a JSON object of strings, or is too large.
    #[error("lookup data file {}: {reason}", path.display())]
    DataFile {
        /// The data file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The request itself is malformed (no call, an oversized field, a write without an
    /// effect key). Nothing was applied.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The request names a tool this executor does not serve.
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    /// Verify was asked for a verifier this executor does not serve. NOT_FOUND, like an
    /// unknown tool: the gateway's registry names the wrong executor, and the gateway
    /// turns the status into an UNDECIDED check that says so.
    #[error("unknown verifier {0:?}")]
    UnknownVerifier(String),
    /// Reconcile was asked about a read-only tool, which has no effects to reconcile.
    #[error("tool {0:?} is read-only and has no effects to reconcile")]
    NotReconcilable(String),
    /// Fault injection: the request failed on purpose before anything was applied.
    #[error("injected fault: failed before apply")]
    InjectedFailBeforeApply,
    /// Fault injection: the effect *was* applied durably, but the reply is replaced by
    /// this error, as if it had been lost on the way back.
    #[error("injected fault: reply dropped after apply")]
    InjectedDroppedReply,
    /// The effect record cannot be written (the apply was rolled back) or is in doubt
    /// after a failed rollback; see the detail.
    #[error("effect record unavailable: {0}")]
    RecordUnavailable(String),
}

impl From<DemoError> for tonic::Status {
    fn from(error: DemoError) -> Self {
        let message = agentloop_proto::bounded_message(error.to_string());
        match error {
            DemoError::InvalidRequest(_) | DemoError::NotReconcilable(_) => {
                tonic::Status::invalid_argument(message)
            }
            DemoError::UnknownTool(_) | DemoError::UnknownVerifier(_) => {
                tonic::Status::not_found(message)
            }
            // UNAVAILABLE is what a lost connection looks like to the caller; both
            // injected faults imitate exactly that.
            DemoError::InjectedFailBeforeApply | DemoError::InjectedDroppedReply => {
                tonic::Status::unavailable(message)
            }
            // Start-up errors never reach a request; the mapping is total anyway.
            DemoError::Io { .. }
            | DemoError::CorruptRecord { .. }
            | DemoError::DataFile { .. }
            | DemoError::InvalidConfig(_)
            | DemoError::RecordUnavailable(_) => tonic::Status::internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn every_error_maps_to_its_status_code() {
        let io = || std::io::Error::other("disk");
        let cases = [
            (DemoError::InvalidRequest("x".into()), Code::InvalidArgument),
            (
                DemoError::NotReconcilable("lookup".into()),
                Code::InvalidArgument,
            ),
            (DemoError::UnknownTool("nope".into()), Code::NotFound),
            (DemoError::UnknownVerifier("nope".into()), Code::NotFound),
            (DemoError::InjectedFailBeforeApply, Code::Unavailable),
            (DemoError::InjectedDroppedReply, Code::Unavailable),
            (DemoError::RecordUnavailable("x".into()), Code::Internal),
            (DemoError::InvalidConfig("x".into()), Code::Internal),
            (
                DemoError::Io {
                    action: "read",
                    path: "/x".into(),
                    source: io(),
                },
                Code::Internal,
            ),
            (
                DemoError::CorruptRecord {
                    path: "/x".into(),
                    line: 1,
                    reason: "r".into(),
                },
                Code::Internal,
            ),
            (
                DemoError::DataFile {
                    path: "/x".into(),
                    reason: "r".into(),
                },
                Code::Internal,
            ),
        ];
        for (error, code) in cases {
            let text = error.to_string();
            let status = tonic::Status::from(error);
            assert_eq!(status.code(), code, "{text}");
            assert_eq!(status.message(), text);
        }
    }
}
