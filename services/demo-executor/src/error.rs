//! The one error type of the demo executor and its one mapping to `tonic::Status`.

use std::path::PathBuf;

use agentloop_executor::{BuildError, RecordError};

/// Why the demo executor could not start, or a fault it injected on purpose.
///
/// Tool failures a model should see (a bad argument, an unknown lookup key) are *not*
/// errors here: they are `ToolResult`s with a structured `ToolError`, as the contract
/// asks. Malformed requests and unknown tools are `agentloop-executor`'s
/// [`RequestError`](agentloop_executor::RequestError)s; these are the demo's own.
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
    /// The data directory holds a record of the old format, which this version does not
    /// read; starting without it would forget the transfers in it.
    #[error(
        "{} is a transfer record of an earlier version, which is not read; move it away to start with an empty record",
        path.display()
    )]
    LegacyRecord {
        /// The old record file.
        path: PathBuf,
    },
    /// The record cannot tell what it holds (see the detail).
    #[error("effect record unavailable: {0}")]
    RecordUnavailable(String),
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
    /// The demo's tools and verifier do not make a valid executor (a bug of this crate).
    #[error("cannot build the executor: {0}")]
    Executor(#[from] BuildError),
    /// Fault injection: the request failed on purpose before anything was applied.
    #[error("injected fault: failed before apply")]
    InjectedFailBeforeApply,
    /// Fault injection: the effect *was* applied durably, but the reply is replaced by
    /// this error, as if it had been lost on the way back.
    #[error("injected fault: reply dropped after apply")]
    InjectedDroppedReply,
}

impl From<RecordError> for DemoError {
    fn from(error: RecordError) -> Self {
        match error {
            RecordError::Io {
                action,
                path,
                source,
            } => DemoError::Io {
                action,
                path,
                source,
            },
            RecordError::Corrupt { path, line, reason } => {
                DemoError::CorruptRecord { path, line, reason }
            }
            other @ (RecordError::Full
            | RecordError::EntryTooLarge { .. }
            | RecordError::ReceiptTaken { .. }
            | RecordError::AppendFailed(_)
            | RecordError::InDoubt(_)) => DemoError::RecordUnavailable(other.to_string()),
        }
    }
}

impl From<DemoError> for tonic::Status {
    fn from(error: DemoError) -> Self {
        let message = agentloop_proto::bounded_message(error.to_string());
        match error {
            // UNAVAILABLE is what a lost connection looks like to the caller; both
            // injected faults imitate exactly that.
            DemoError::InjectedFailBeforeApply | DemoError::InjectedDroppedReply => {
                tonic::Status::unavailable(message)
            }
            // Start-up errors never reach a request; the mapping is total anyway.
            DemoError::Io { .. }
            | DemoError::CorruptRecord { .. }
            | DemoError::LegacyRecord { .. }
            | DemoError::RecordUnavailable(_)
            | DemoError::DataFile { .. }
            | DemoError::InvalidConfig(_)
            | DemoError::Executor(_) => tonic::Status::internal(message),
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
                DemoError::LegacyRecord { path: "/x".into() },
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

    #[test]
    fn record_errors_keep_their_kind() {
        let corrupt = DemoError::from(RecordError::Corrupt {
            path: "/x".into(),
            line: 3,
            reason: "r".into(),
        });
        assert!(matches!(corrupt, DemoError::CorruptRecord { line: 3, .. }));
        let io = DemoError::from(RecordError::Io {
            action: "read",
            path: "/x".into(),
            source: std::io::Error::other("disk"),
        });
        assert!(matches!(io, DemoError::Io { .. }));
        assert!(matches!(
            DemoError::from(RecordError::Full),
            DemoError::RecordUnavailable(_)
        ));
    }
}
