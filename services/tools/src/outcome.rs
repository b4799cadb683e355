//! How a failed forward to an executor becomes the call's one terminal result.
//!
//! This is the heart of the gateway, kept as pure functions of (side effect, failure)
//! so every case is tested without a network. The rule behind every arm:
//!
//! - **Nothing was sent** because no concurrency slot freed up before the deadline:
//!   `not_started`, whatever the tool does. It had no effect, so it may be dispatched
//!   again.
//! - **The executor cannot be reached** (the connection failed, or it is known to be
//!   down): a structured `UNAVAILABLE` error, retryable, whatever the tool does. Nothing
//!   was sent, so nothing was applied, and the model is told why.
//! - **The request may have reached the executor** and no result came back (deadline,
//!   cancellation, reset, most statuses): for a *write* (or idempotent write) the
//!   outcome is `unknown`, never a plain error, because the change may have been
//!   applied; the orchestrator reconciles it through the effect key. For a *read*
//!   nothing can have changed, so it is a structured, usually retryable, `ToolError`.
//! - **The executor refused the request as malformed** (`INVALID_ARGUMENT`): by the
//!   contract it applied nothing, so it is `INVALID_ARGUMENTS`, not retryable, for
//!   every kind of tool. So is `UNIMPLEMENTED` (no handler ran at all).

use agentloop_engine::SideEffect;
use agentloop_proto::v1::tool_result::{NotStarted, Outcome, OutcomeUnknown};
use agentloop_proto::v1::{ErrorType, NextAction, ToolError};
use tonic::Code;

/// Why a forwarded call produced no result.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallFailure {
    /// Nothing reached the executor: the deadline passed while waiting for a
    /// concurrency slot.
    NotSent {
        /// What happened, for the result's reason.
        detail: String,
    },
    /// Nothing reached the executor because it cannot be reached: the connection could
    /// not be established, or the gateway knows it is down.
    Unreachable {
        /// What happened, for the error's message.
        detail: String,
    },
    /// The gateway's deadline for the call passed while it was in flight.
    DeadlineExceeded,
    /// A gRPC status from the executor or the transport, after the request may have
    /// been sent.
    Status {
        /// The status code.
        code: Code,
        /// The status message.
        message: String,
    },
    /// The executor answered, but without a result (or for another call ID): a broken
    /// executor. Its handler ran, so a write may have been applied.
    MalformedReply {
        /// What was wrong with the reply.
        detail: String,
    },
}

/// Classifies a status returned by the executor client: a status caused by a failed
/// connection attempt (tonic's [`tonic::ConnectError`] in its source chain) means
/// nothing was sent; any other status means the request may have been delivered.
pub fn classify_status(status: &tonic::Status) -> CallFailure {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    // The chain is finite (each error owns its source); the bound is belt and braces.
    for _ in 0..32 {
        let Some(error) = source else { break };
        if error.downcast_ref::<tonic::ConnectError>().is_some() {
            return CallFailure::Unreachable {
                detail: format!("cannot connect to the executor: {}", status.message()),
            };
        }
        source = error.source();
    }
    CallFailure::Status {
        code: status.code(),
        message: status.message().to_owned(),
    }
}

/// The terminal outcome of a call that failed as `failure`, for a tool of kind
/// `side_effect`.
pub fn failure_outcome(side_effect: SideEffect, failure: &CallFailure) -> Outcome {
    let message = match failure {
        CallFailure::NotSent { detail } => {
            return Outcome::NotStarted(NotStarted {
                reason: detail.clone(),
            });
        }
        CallFailure::Unreachable { detail } => {
            return error(
                ErrorType::Unavailable,
                detail.clone(),
                true,
                NextAction::Retry,
            );
        }
        CallFailure::DeadlineExceeded => {
            "the call's deadline passed before the executor replied".to_owned()
        }
        CallFailure::Status { code, message } => format!("executor status {code:?}: {message}"),
        CallFailure::MalformedReply { detail } => format!("malformed executor reply: {detail}"),
    };
    // Definite refusals first: the executor did not run the call, whatever it is.
    match failure {
        CallFailure::Status {
            code: Code::InvalidArgument,
            ..
        } => {
            return error(
                ErrorType::InvalidArguments,
                message,
                false,
                NextAction::FixArguments,
            );
        }
        CallFailure::Status {
            code: Code::Unimplemented,
            ..
        } => {
            return error(ErrorType::Internal, message, false, NextAction::Stop);
        }
        CallFailure::NotSent { .. }
        | CallFailure::Unreachable { .. }
        | CallFailure::DeadlineExceeded
        | CallFailure::Status { .. }
        | CallFailure::MalformedReply { .. } => {}
    }
    match side_effect {
        SideEffect::Write | SideEffect::IdempotentWrite => Outcome::Unknown(OutcomeUnknown {
            detail: format!("{message} (the change may have been applied)"),
        }),
        SideEffect::ReadOnly => read_failure(failure, message),
    }
}

/// A read that failed after dispatch: nothing changed, so say what kind of failure it
/// was and whether the same call may simply be sent again.
fn read_failure(failure: &CallFailure, message: String) -> Outcome {
    use ErrorType as E;
    use NextAction as N;
    let (error_type, retryable, next) = match failure {
        CallFailure::NotSent { .. } | CallFailure::DeadlineExceeded => (E::Timeout, true, N::Retry),
        CallFailure::Unreachable { .. } => (E::Unavailable, true, N::Retry),
        CallFailure::MalformedReply { .. } => (E::Internal, false, N::Stop),
        CallFailure::Status { code, .. } => match code {
            Code::DeadlineExceeded | Code::Cancelled => (E::Timeout, true, N::Retry),
            Code::Unavailable | Code::ResourceExhausted => (E::Unavailable, true, N::Retry),
            Code::Aborted => (E::Conflict, true, N::Retry),
            Code::AlreadyExists => (E::Conflict, false, N::None),
            Code::NotFound => (E::NotFound, false, N::None),
            Code::FailedPrecondition => (E::Rejected, false, N::None),
            Code::PermissionDenied | Code::Unauthenticated => (E::PermissionDenied, false, N::Stop),
            Code::InvalidArgument | Code::OutOfRange => {
                (E::InvalidArguments, false, N::FixArguments)
            }
            Code::Unimplemented => (E::Internal, false, N::Stop),
            Code::Ok | Code::Unknown | Code::Internal | Code::DataLoss => {
                (E::Internal, false, N::None)
            }
        },
    };
    error(error_type, message, retryable, next)
}

fn error(error_type: ErrorType, message: String, retryable: bool, next: NextAction) -> Outcome {
    Outcome::Error(ToolError {
        error_type: error_type as i32,
        message,
        retryable,
        next_allowed_action: next as i32,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::wildcard_enum_match_arm)]

    use super::*;

    const ALL_CODES: [Code; 17] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];
    const WRITES: [SideEffect; 2] = [SideEffect::Write, SideEffect::IdempotentWrite];

    fn status(code: Code) -> CallFailure {
        CallFailure::Status {
            code,
            message: "m".into(),
        }
    }

    fn tool_error(outcome: Outcome) -> ToolError {
        match outcome {
            Outcome::Error(e) => e,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn nothing_sent_is_not_started_for_every_kind() {
        for kind in [
            SideEffect::ReadOnly,
            SideEffect::Write,
            SideEffect::IdempotentWrite,
        ] {
            let outcome = failure_outcome(
                kind,
                &CallFailure::NotSent {
                    detail: "refused".into(),
                },
            );
            assert_eq!(
                outcome,
                Outcome::NotStarted(NotStarted {
                    reason: "refused".into()
                })
            );
        }
    }

    /// Nothing reached an executor that cannot be reached: whatever the tool does, the
    /// model sees a retryable UNAVAILABLE error, never an unknown outcome.
    #[test]
    fn an_unreachable_executor_is_unavailable_for_every_kind() {
        for kind in [
            SideEffect::ReadOnly,
            SideEffect::Write,
            SideEffect::IdempotentWrite,
        ] {
            let failure = CallFailure::Unreachable {
                detail: "the executor is down".into(),
            };
            let error = tool_error(failure_outcome(kind, &failure));
            assert_eq!(error.error_type, ErrorType::Unavailable as i32, "{kind:?}");
            assert!(error.retryable);
            assert_eq!(error.next_allowed_action, NextAction::Retry as i32);
            assert_eq!(error.message, "the executor is down");
        }
    }

    #[test]
    fn a_write_that_may_have_been_sent_is_unknown_never_an_error() {
        let definite = [Code::InvalidArgument, Code::Unimplemented];
        for kind in WRITES {
            for code in ALL_CODES.into_iter().filter(|c| !definite.contains(c)) {
                assert!(
                    matches!(failure_outcome(kind, &status(code)), Outcome::Unknown(_)),
                    "{kind:?} {code:?}"
                );
            }
            assert!(matches!(
                failure_outcome(kind, &CallFailure::DeadlineExceeded),
                Outcome::Unknown(_)
            ));
            let malformed = CallFailure::MalformedReply {
                detail: "no result".into(),
            };
            assert!(matches!(
                failure_outcome(kind, &malformed),
                Outcome::Unknown(_)
            ));
        }
    }

    #[test]
    fn invalid_argument_is_a_definite_refusal_for_every_kind() {
        for kind in [
            SideEffect::ReadOnly,
            SideEffect::Write,
            SideEffect::IdempotentWrite,
        ] {
            let e = tool_error(failure_outcome(kind, &status(Code::InvalidArgument)));
            assert_eq!(e.error_type, ErrorType::InvalidArguments as i32);
            assert!(!e.retryable);
            assert_eq!(e.next_allowed_action, NextAction::FixArguments as i32);
            let e = tool_error(failure_outcome(kind, &status(Code::Unimplemented)));
            assert_eq!(e.error_type, ErrorType::Internal as i32);
            assert!(!e.retryable);
        }
    }

    #[test]
    fn reads_get_a_structured_error_for_every_code() {
        use ErrorType as E;
        let expected = |code: Code| -> (E, bool) {
            match code {
                Code::DeadlineExceeded | Code::Cancelled => (E::Timeout, true),
                Code::Unavailable | Code::ResourceExhausted => (E::Unavailable, true),
                Code::Aborted => (E::Conflict, true),
                Code::AlreadyExists => (E::Conflict, false),
                Code::NotFound => (E::NotFound, false),
                Code::FailedPrecondition => (E::Rejected, false),
                Code::PermissionDenied | Code::Unauthenticated => (E::PermissionDenied, false),
                Code::InvalidArgument | Code::OutOfRange => (E::InvalidArguments, false),
                Code::Unimplemented
                | Code::Ok
                | Code::Unknown
                | Code::Internal
                | Code::DataLoss => (E::Internal, false),
            }
        };
        for code in ALL_CODES {
            let e = tool_error(failure_outcome(SideEffect::ReadOnly, &status(code)));
            let (error_type, retryable) = expected(code);
            assert_eq!(
                (e.error_type, e.retryable),
                (error_type as i32, retryable),
                "{code:?}"
            );
            assert!(e.message.contains('m'));
        }
        let timeout = tool_error(failure_outcome(
            SideEffect::ReadOnly,
            &CallFailure::DeadlineExceeded,
        ));
        assert_eq!(
            (timeout.error_type, timeout.retryable),
            (E::Timeout as i32, true)
        );
        assert_eq!(timeout.next_allowed_action, NextAction::Retry as i32);
        let malformed = CallFailure::MalformedReply { detail: "x".into() };
        let e = tool_error(failure_outcome(SideEffect::ReadOnly, &malformed));
        assert_eq!((e.error_type, e.retryable), (E::Internal as i32, false));
    }

    #[test]
    fn a_connect_error_in_the_source_chain_means_unreachable() {
        let connect = tonic::ConnectError(Box::new(std::io::Error::other("refused")));
        let status = tonic::Status::from_error(Box::new(connect));
        assert_eq!(status.code(), Code::Unavailable);
        assert!(
            matches!(classify_status(&status), CallFailure::Unreachable { .. }),
            "{status:?}"
        );
        let plain = tonic::Status::unavailable("connection reset");
        assert_eq!(
            classify_status(&plain),
            CallFailure::Status {
                code: Code::Unavailable,
                message: "connection reset".into()
            }
        );
    }
}
