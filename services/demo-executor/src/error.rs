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
    /// The transfer record could not be opened, read or written, or a complete line of
    /// it is damaged. A torn *last* line is expected after a crash and ignored; a bad
    /// line before it means the file was damaged, and starting anyway could forget an
    /// applied transfer.
    #[error("effect record unavailable: {0}")]
    Record(#[from] RecordError),
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
            DemoError::Record(_)
            | DemoError::LegacyRecord { .. }
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
            (DemoError::Record(RecordError::Full), Code::Internal),
            (DemoError::InvalidConfig("x".into()), Code::Internal),
            (
                DemoError::Record(RecordError::Io {
                    action: "read",
                    path: "/x".into(),
                    source: io(),
                }),
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
        agentloop_proto::testing::assert_codes(cases);
    }
}
