//! The ledger's errors and their one mapping to gRPC status codes.

use crate::state::TransitionError;

/// Everything the ledger can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A request field is missing, too long, or holds an unknown enum value.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The request field, as named in the proto.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// No entry has this effect key.
    #[error("no effect with key {effect_key:?}")]
    NotFound {
        /// The key asked for.
        effect_key: String,
    },
    /// Prepare named an existing effect key for a different invocation, call or tool.
    #[error(
        "effect key {effect_key:?} is already prepared for invocation {invocation_id:?}, \
         call {call_id:?}, tool {tool:?}"
    )]
    AlreadyExists {
        /// The contested key.
        effect_key: String,
        /// The owner on record.
        invocation_id: String,
        /// The owner's call.
        call_id: String,
        /// The owner's tool.
        tool: String,
    },
    /// The entry is not in a state that allows the requested change.
    #[error("effect {effect_key:?}: {source}")]
    Transition {
        /// Which entry.
        effect_key: String,
        /// Why the change was refused (names both states).
        #[source]
        source: TransitionError,
    },
    /// A stored row cannot be read back (e.g. an unknown state name): the database was
    /// changed outside the ledger.
    #[error("effect {effect_key:?} is stored corrupt: {reason}")]
    Corrupt {
        /// Which entry.
        effect_key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The database failed.
    #[error("ledger storage failed: {0}")]
    Storage(#[from] sqlx::Error),
    /// The schema could not be brought up to date at open.
    #[error("ledger schema migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The data directory could not be created.
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl LedgerError {
    /// Shorthand for [`LedgerError::InvalidArgument`].
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        LedgerError::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }
}

/// The one place ledger errors become gRPC statuses. Client mistakes carry their full
/// message; storage failures are logged here and answered with a generic message, so
/// database details do not leak to callers.
impl From<LedgerError> for tonic::Status {
    fn from(error: LedgerError) -> Self {
        use tonic::{Code, Status};
        let message = || agentloop_proto::bounded_message(error.to_string());
        match &error {
            LedgerError::InvalidArgument { .. } => Status::invalid_argument(message()),
            LedgerError::NotFound { .. } => Status::not_found(message()),
            LedgerError::AlreadyExists { .. } => Status::already_exists(message()),
            LedgerError::Transition { .. } => Status::failed_precondition(message()),
            LedgerError::Corrupt { .. } => {
                tracing::error!(%error, "corrupt ledger row");
                Status::new(Code::DataLoss, message())
            }
            LedgerError::Storage(source) => {
                tracing::error!(%error, "ledger storage error");
                if is_transient(source) {
                    Status::unavailable("ledger storage is busy; retry")
                } else {
                    Status::internal("ledger storage error")
                }
            }
            LedgerError::Migrate(_) | LedgerError::DataDir { .. } => {
                tracing::error!(%error, "ledger not initialised");
                Status::internal("ledger storage error")
            }
        }
    }
}

/// Failures that a retry may cure (a lock held too long, an exhausted pool, I/O, a
/// server that is restarting).
fn is_transient(error: &sqlx::Error) -> bool {
    if matches!(
        error,
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_)
    ) {
        return true;
    }
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // SQLITE_BUSY (5) and SQLITE_LOCKED (6), possibly as extended result codes.
        return db
            .code()
            .and_then(|code| code.parse::<i64>().ok())
            .is_some_and(|code| matches!(code & 0xff, 5 | 6));
    }
    if let Some(postgres) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return PG_TRANSIENT.contains(&postgres.code());
    }
    false
}

/// PostgreSQL SQLSTATEs a retry may cure: serialization_failure, deadlock_detected,
/// lock_not_available (our `lock_timeout`), too_many_connections, admin_shutdown,
/// crash_shutdown, cannot_connect_now.
const PG_TRANSIENT: [&str; 7] = [
    "40001", "40P01", "55P03", "53300", "57P01", "57P02", "57P03",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::EffectState;
    use tonic::Code;

    #[test]
    fn each_error_maps_to_its_code_with_a_useful_message() {
        let cases: Vec<(LedgerError, Code, &str)> = vec![
            (
                LedgerError::invalid("effect_key", "must not be empty"),
                Code::InvalidArgument,
                "invalid effect_key: must not be empty",
            ),
            (
                LedgerError::NotFound {
                    effect_key: "k".into(),
                },
                Code::NotFound,
                "no effect with key \"k\"",
            ),
            (
                LedgerError::AlreadyExists {
                    effect_key: "k".into(),
                    invocation_id: "i".into(),
                    call_id: "c".into(),
                    tool: "t".into(),
                },
                Code::AlreadyExists,
                "already prepared for invocation \"i\"",
            ),
            (
                LedgerError::Transition {
                    effect_key: "k".into(),
                    source: TransitionError::Illegal {
                        from: EffectState::Committed,
                        to: EffectState::Dispatched,
                    },
                },
                Code::FailedPrecondition,
                "illegal transition from COMMITTED to DISPATCHED",
            ),
            (
                LedgerError::Corrupt {
                    effect_key: "k".into(),
                    reason: "bad state".into(),
                },
                Code::DataLoss,
                "bad state",
            ),
            (
                LedgerError::Storage(sqlx::Error::PoolTimedOut),
                Code::Unavailable,
                "retry",
            ),
            (
                LedgerError::Storage(sqlx::Error::RowNotFound),
                Code::Internal,
                "ledger storage error",
            ),
        ];
        for (error, code, fragment) in cases {
            let status = tonic::Status::from(error);
            assert_eq!(status.code(), code, "{status:?}");
            assert!(status.message().contains(fragment), "{status:?}");
        }
    }

    #[test]
    fn storage_details_do_not_leak() {
        let status = tonic::Status::from(LedgerError::Storage(sqlx::Error::Protocol(
            "secret path /var/db".into(),
        )));
        assert!(!status.message().contains("secret"), "{status:?}");
    }
}
