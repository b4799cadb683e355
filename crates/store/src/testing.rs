//! Throwaway PostgreSQL databases for tests, shared by every crate that tests against the
//! server (the event store here, the ledger store, ...) so the rules live in one place:
//!
//! - the server is the one `AGENTLOOP_TEST_POSTGRES_URL` names; without it, one the test
//!   process starts for itself (`initdb` into a temporary folder, `postgres` on a free
//!   loopback port, both gone with the process), shared by the tests of that process.
//!   Its binaries come from Debian's `postgresql` package (or `PATH`); nothing needs
//!   to be running beforehand;
//! - the server's own database is only used to create and drop others: each test gets a
//!   database of its own, `agentloop_test_<random>`, dropped (with `WITH (FORCE)`, so
//!   leftover connections do not keep it alive) when the [`TestDatabase`] is dropped
//!   (`crate::databases`);
//! - when no server can be had, a test skips loudly (a `SKIPPED` line on stderr) — unless
//!   `AGENTLOOP_REQUIRE_POSTGRES=1`, as CI sets, in which case it fails.
//!
//! This is test support behind the `test-util` feature (like [`crate::conformance`]), not
//! for production code: it panics where a test should fail, and only reads the environment.
//!
//! ```no_run
//! # async fn example() {
//! use agentloop_store::testing::PostgresServer;
//! let Some(server) = PostgresServer::for_test("my_test").await else {
//!     return; // skipped, and said so
//! };
//! let database = server.create_database().await.unwrap();
//! let url = database.url(); // connect a store here
//! # let _ = url;
//! # }
//! ```

// A test harness reports a broken expectation (a required server missing) by panicking.
#![allow(clippy::panic)]

use std::io::Write;
use std::path::Path;

use sqlx::Connection;
use sqlx::migrate::Migrator;

use crate::databases::redact;

mod throwaway;

/// The environment variable naming an existing server's admin URL, for tests to use
/// instead of starting one.
pub const POSTGRES_URL_VAR: &str = "AGENTLOOP_TEST_POSTGRES_URL";

/// The environment variable that, set to `1`, turns a skip for a missing server into a
/// failure.
pub const REQUIRE_POSTGRES_VAR: &str = "AGENTLOOP_REQUIRE_POSTGRES";

/// The prefix of every database this module creates (so a leftover is easy to spot).
pub const TEST_DATABASE_PREFIX: &str = "agentloop_test_";

/// A reachable PostgreSQL server to create test databases on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresServer {
    admin_url: String,
}

impl PostgresServer {
    /// The server tests should use: the one `AGENTLOOP_TEST_POSTGRES_URL` names, else this
    /// process's own (started by the first test that asks).
    ///
    /// Returns `None` after printing a `SKIPPED` line naming `test` when there is none.
    ///
    /// # Panics
    ///
    /// When there is none and `AGENTLOOP_REQUIRE_POSTGRES=1`.
    pub async fn for_test(test: &str) -> Option<PostgresServer> {
        let named = std::env::var(POSTGRES_URL_VAR)
            .ok()
            .filter(|url| !url.is_empty());
        let found = match named {
            Some(url) => PostgresServer::connect(&url)
                .await
                .map_err(|error| format!("no PostgreSQL at {} ({error})", redact(&url))),
            None => own_server().map(|admin_url| PostgresServer { admin_url }),
        };
        match found {
            Ok(server) => Some(server),
            Err(why) if postgres_required() => {
                panic!("{test}: {why}, and {REQUIRE_POSTGRES_VAR}=1")
            }
            Err(why) => {
                loud(&format!(
                    "SKIPPED {test}: {why}; set {POSTGRES_URL_VAR} to use a running server, \
                     or {REQUIRE_POSTGRES_VAR}=1 to fail instead of skipping"
                ));
                None
            }
        }
    }

    /// The server at `admin_url`, if a connection to it succeeds in time.
    pub async fn connect(admin_url: &str) -> Result<PostgresServer, sqlx::Error> {
        let mut conn = crate::databases::connect(admin_url).await?;
        sqlx::query("SELECT 1").execute(&mut conn).await?;
        conn.close().await?;
        Ok(PostgresServer {
            admin_url: admin_url.to_owned(),
        })
    }

    /// The URL of the server's admin database.
    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    /// Creates a new, empty database with a unique name.
    pub async fn create_database(&self) -> Result<TestDatabase, sqlx::Error> {
        TestDatabase::create(&self.admin_url, TEST_DATABASE_PREFIX).await
    }
}

/// A PostgreSQL server a harness starts on a host of its own (a network namespace that
/// exists, with `address` on one of its links), as the process's own server is started;
/// stopped, and its folder removed, when dropped. `agentloop chaos` cuts its links.
#[derive(Debug)]
pub struct HostedPostgres {
    server: Option<throwaway::Throwaway>,
}

impl HostedPostgres {
    /// Starts the server in `namespace`, listening on `address`, port 5432.
    ///
    /// # Errors
    ///
    /// What a person must fix, in one line (as for the process's own server).
    pub fn start(namespace: &str, address: std::net::IpAddr) -> Result<HostedPostgres, String> {
        let placement = throwaway::Placement {
            namespace: Some(namespace.to_owned()),
            address,
        };
        throwaway::Throwaway::start_at(&placement).map(|server| HostedPostgres {
            server: Some(server),
        })
    }

    /// The server, to create databases on.
    pub fn server(&self) -> PostgresServer {
        PostgresServer {
            admin_url: self
                .server
                .as_ref()
                .map(throwaway::Throwaway::admin_url)
                .unwrap_or_default(),
        }
    }
}

impl Drop for HostedPostgres {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            let _ = server.stop();
        }
    }
}

/// A database that exists for one test; dropped with the value.
pub type TestDatabase = crate::databases::Database;

/// The admin URL of this process's own server, started on first use; every test of the
/// process shares it (each in a database of its own), and a failed start is reported to
/// each.
fn own_server() -> Result<String, String> {
    static SERVER: std::sync::OnceLock<Result<throwaway::Throwaway, String>> =
        std::sync::OnceLock::new();
    // Blocking, once per process: the tests that ask meanwhile wait for the same server.
    SERVER
        .get_or_init(throwaway::Throwaway::start)
        .as_ref()
        .map(throwaway::Throwaway::admin_url)
        .map_err(|why| format!("no PostgreSQL server of its own: {why}"))
}

/// Writes a line to the process's stderr directly: the test harness captures `eprintln!`
/// of a passing test, and a skip must be seen.
fn loud(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Whether a missing server fails the test instead of skipping it.
pub fn postgres_required() -> bool {
    std::env::var(REQUIRE_POSTGRES_VAR).is_ok_and(|value| value.trim() == "1")
}

/// The first `count` migrations of `backend` (`"sqlite"` or `"postgres"`), copied into
/// `dir`: they build a database as an earlier release left it, so that a test can check an
/// upgrade keeps what is there.
///
/// # Panics
///
/// When the migrations cannot be read or copied, or there are fewer than `count`.
pub async fn earlier_migrations(backend: &str, count: usize, dir: &Path) -> Migrator {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(backend);
    let mut files: Vec<_> = std::fs::read_dir(&source)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", source.display()))
        .map(|entry| entry.unwrap_or_else(|error| panic!("{error}")).path())
        .collect();
    files.sort();
    assert!(
        files.len() >= count,
        "{backend} has {} migrations",
        files.len()
    );
    for path in &files[..count] {
        let name = path.file_name().unwrap_or_default();
        std::fs::copy(path, dir.join(name))
            .unwrap_or_else(|error| panic!("cannot copy {}: {error}", path.display()));
    }
    Migrator::new(dir)
        .await
        .unwrap_or_else(|error| panic!("cannot load the copied migrations: {error}"))
}
