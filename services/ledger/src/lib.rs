//! The effect ledger service of agentloop: the durable record of external writes.
//!
//! Before a tool call with side effects is sent to its executor, the orchestrator
//! *prepares* it here under a stable effect key, marks it *dispatched*, and records the
//! outcome (*committed*, *rejected* or *outcome unknown*). After a crash, the entries
//! still unresolved tell a resuming worker which effects it must reconcile with their
//! executor before going on, so no change is applied twice or silently lost. Before an
//! invocation's final answer, all of its entries (ListByInvocation) tell the orchestrator
//! whether every write the answer rests on was committed.
//!
//! - [`state`]: the transition rules, a pure function (`agentloop-effects`'s `entry`, beside the
//!   worker's side of the protocol);
//! - [`store`]: [`LedgerStore`], one type over SQLite (WAL, `synchronous=FULL`, the
//!   embedded default) and PostgreSQL (`synchronous_commit=on`, shared by several
//!   processes), with the same guarded writes on both;
//! - [`service`]: [`LedgerService`], the `agentloop.v1.EffectLedgerService` impl;
//! - [`run`]: serve it on a listener until a shutdown future resolves.
//!
//! An effect whose executor cannot reconcile it is recorded RECONCILIATION_REQUIRED: it
//! stays listed as unresolved (`agentloop effects --unresolved`) until an operator
//! settles it with a guarded Record(COMMITTED | REJECTED).
//!
//! It is *not* the reconciler: it records what workers tell it and enforces the
//! transitions, but it never calls executors. It does not store tool arguments or
//! outputs either — only identity, state and a bounded detail text.

#![warn(missing_docs)]

pub mod error;
mod observe;
pub mod service;
pub use agentloop_effects::entry as state;
pub mod store;

use std::future::Future;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

pub use error::LedgerError;
pub use service::LedgerService;
pub use state::{Action, EffectState, Outcome};
pub use store::{Backend, Entry, LedgerStore, NewEffect, Page, StoreOptions};

/// Prefix of the environment variables that configure the ledger
/// (`AGENTLOOP_LEDGER_LISTEN`, `AGENTLOOP_LEDGER_DATA_DIR`,
/// `AGENTLOOP_LEDGER_DATABASE_URL`, ...).
pub const ENV_PREFIX: &str = "AGENTLOOP_LEDGER_";
/// File name of the database inside the data directory.
pub const DB_FILE: &str = "ledger.sqlite3";

/// The default effect key of a tool call: lowercase hex SHA-256 over a domain tag and
/// the length-prefixed invocation and call IDs.
///
/// Why not `"{invocation}:{call}"`: IDs may contain `:`, so two different pairs could
/// give the same key; and executors often bound idempotency keys (tens to a few
/// hundred bytes), which a fixed 64-character key always fits. Length prefixes make
/// the encoding injective; the domain tag keeps these keys apart from other hashes.
/// The value is part of the durable format: changing it would orphan stored entries.
pub fn effect_key(invocation_id: &str, call_id: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"agentloop.effect_key.v1\0");
    for part in [invocation_id, call_id] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// The ledger's configuration (layered by `agentloop_server::config`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LedgerConfig {
    /// The settings every service has: `listen`, `metrics_listen`, `[auth]`,
    /// `insecure_no_auth`, `[telemetry]`, `[server_tls]`.
    #[serde(flatten)]
    pub server: agentloop_server::ServerSettings,
    /// A PostgreSQL database, `postgres://user[:password]@host[:port]/database`, shared
    /// by every ledger process of a deployment; the database must exist, its schema is
    /// brought up to date on start. When unset, the ledger is the SQLite file in
    /// `data_dir`.
    pub database_url: Option<String>,
    /// Directory holding the SQLite file ([`DB_FILE`]); created if missing. Unused
    /// with `database_url`.
    pub data_dir: PathBuf,
    /// How long a write waits for another writer's lock, in milliseconds (SQLite's
    /// busy timeout, PostgreSQL's `lock_timeout`).
    pub busy_timeout_ms: u64,
    /// Connection pool size.
    pub max_connections: u32,
    /// Keys no setting took: refused as the configuration loads.
    #[serde(flatten)]
    pub unknown: agentloop_server::UnknownKeys,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            server: agentloop_server::ServerSettings::on_port(50055),
            database_url: None,
            data_dir: PathBuf::from("data/ledger"),
            busy_timeout_ms: 5_000,
            max_connections: 4,
            unknown: agentloop_server::UnknownKeys,
        }
    }
}

/// The shared start (`agentloop_server::Service::start`) binds `listen`.
impl agentloop_server::ServiceConfig for LedgerConfig {
    type Auth = agentloop_auth::CallersConfig;

    fn server(&self) -> &agentloop_server::ServerSettings {
        &self.server
    }
}

impl LedgerConfig {
    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_connections == 0 {
            return Err("max_connections must be at least 1".into());
        }
        if let Some(url) = &self.database_url {
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return Err("database_url must be a postgres:// or postgresql:// URL \
                     (leave it unset for the SQLite file in data_dir)"
                    .into());
            }
            sqlx::postgres::PgConnectOptions::from_str(url)
                .map_err(|error| format!("database_url is not a valid PostgreSQL URL: {error}"))?;
        }
        Ok(())
    }

    /// Where the entries are kept, for log lines: the SQLite file, or the PostgreSQL
    /// host, port and database (never the URL, which may hold a password).
    pub fn describe_backend(&self) -> String {
        match &self.database_url {
            None => format!("sqlite {}", self.data_dir.join(DB_FILE).display()),
            Some(url) => match sqlx::postgres::PgConnectOptions::from_str(url) {
                Ok(options) => format!(
                    "postgres {}:{}/{}",
                    options.get_host(),
                    options.get_port(),
                    options.get_database().unwrap_or_default()
                ),
                Err(_) => "postgres (invalid URL)".to_owned(),
            },
        }
    }

    /// Opens the store this configuration describes: PostgreSQL with `database_url`,
    /// else the SQLite file in `data_dir` (creating the directory).
    pub async fn open_store(&self) -> Result<LedgerStore, LedgerError> {
        let options = StoreOptions {
            busy_timeout: Duration::from_millis(self.busy_timeout_ms),
            max_connections: self.max_connections,
        };
        if let Some(url) = &self.database_url {
            return LedgerStore::connect_postgres(url, &options).await;
        }
        std::fs::create_dir_all(&self.data_dir).map_err(|source| LedgerError::DataDir {
            path: self.data_dir.clone(),
            source,
        })?;
        LedgerStore::open_sqlite(&self.data_dir.join(DB_FILE), &options).await
    }
}

/// How often a serving ledger counts its unresolved effects for
/// `agentloop_effects_unresolved` (an indexed count, cheap at any size).
pub const COUNT_EVERY: Duration = Duration::from_secs(15);

/// Why [`run`] stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] LedgerError),
    /// The server failed.
    #[error(transparent)]
    Serve(#[from] agentloop_server::ServeError),
}

/// Serves the ledger on `listener` (the configured `listen` address is the binary's
/// business, so tests can pass a port-0 listener) until `shutdown` resolves, then
/// drains in-flight RPCs and closes the database.
pub async fn run(
    listener: TcpListener,
    config: &LedgerConfig,
    access: agentloop_server::Access,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RunError> {
    let store = config.open_store().await?;
    let durability = store.durability().await?;
    tracing::info!(backend = %config.describe_backend(), %durability, "effect ledger store open");
    let service = LedgerService::new(store.clone());
    let counting = tokio::spawn(service.clone().keep_counting(COUNT_EVERY));
    let services = agentloop_server::ServiceSet::new()
        .add_for(agentloop_proto::server::effect_ledger(service), &access);
    let served = agentloop_server::serve(listener, services, shutdown).await;
    counting.abort();
    store.close().await;
    Ok(served?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effect_key_is_stable_and_unambiguous() {
        let key = effect_key("inv-1", "call-1");
        assert_eq!(key.len(), 64);
        assert!(
            key.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(key, effect_key("inv-1", "call-1"));
        // Golden value: the key is durable, so its derivation must never change.
        assert_eq!(key, GOLDEN);
        assert_ne!(effect_key("a:b", "c"), effect_key("a", "b:c"));
        assert_ne!(effect_key("ab", "c"), effect_key("a", "bc"));
        assert_ne!(effect_key("inv-1", "call-2"), key);
    }

    /// Computed independently (Python hashlib) from the documented encoding.
    const GOLDEN: &str = "1bbcdcb60b02482c1e331680d62b675b1ff18285107b27b743d4091ca75a2afe";
}
