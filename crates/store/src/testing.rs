//! Throwaway PostgreSQL databases for tests, shared by every crate that tests against the
//! server (the event store here, the ledger store, ...) so the rules live in one place:
//!
//! - the server is `DATABASE_URL`, or [`DEFAULT_POSTGRES_URL`] (the machine's PostgreSQL
//!   with trust auth); its database is only used to create and drop others;
//! - each test gets a database of its own, `agentloop_test_<random>`, dropped (with
//!   `WITH (FORCE)`, so leftover connections do not keep it alive) when the
//!   [`TestDatabase`] is dropped;
//! - when no server is reachable, a test skips loudly (a `SKIPPED` line on stderr) — unless
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
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// The environment variable naming the server's admin URL.
pub const DATABASE_URL_VAR: &str = "DATABASE_URL";

/// The environment variable that, set to `1`, turns a skip for a missing server into a
/// failure.
pub const REQUIRE_POSTGRES_VAR: &str = "AGENTLOOP_REQUIRE_POSTGRES";

/// The server used when `DATABASE_URL` is not set.
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The prefix of every database this module creates (so a leftover is easy to spot).
pub const TEST_DATABASE_PREFIX: &str = "agentloop_test_";

/// How long connecting to the server may take before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A reachable PostgreSQL server to create test databases on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresServer {
    admin_url: String,
}

impl PostgresServer {
    /// The server tests should use: `DATABASE_URL` or the default.
    ///
    /// Returns `None` after printing a `SKIPPED` line naming `test` when it is unreachable.
    ///
    /// # Panics
    ///
    /// When it is unreachable and `AGENTLOOP_REQUIRE_POSTGRES=1`.
    pub async fn for_test(test: &str) -> Option<PostgresServer> {
        let url = std::env::var(DATABASE_URL_VAR)
            .ok()
            .filter(|url| !url.is_empty())
            .unwrap_or_else(|| DEFAULT_POSTGRES_URL.to_owned());
        match PostgresServer::connect(&url).await {
            Ok(server) => Some(server),
            Err(error) if postgres_required() => panic!(
                "{test}: PostgreSQL at {} is unreachable and {REQUIRE_POSTGRES_VAR}=1: {error}",
                redact(&url)
            ),
            Err(error) => {
                loud(&format!(
                    "SKIPPED {test}: no PostgreSQL at {} ({error}); set {DATABASE_URL_VAR} to \
                     point at one, or {REQUIRE_POSTGRES_VAR}=1 to fail instead of skipping",
                    redact(&url)
                ));
                None
            }
        }
    }

    /// The server at `admin_url`, if a connection to it succeeds in time.
    pub async fn connect(admin_url: &str) -> Result<PostgresServer, sqlx::Error> {
        let mut conn = admin_connection(admin_url).await?;
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
        let name = format!("{TEST_DATABASE_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let mut conn = admin_connection(&self.admin_url).await?;
        // The name is ours (prefix + hex), never input: safe to splice into the statement,
        // which takes no parameters for an identifier.
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        Ok(TestDatabase {
            url: url_with_database(&self.admin_url, &name),
            name,
            admin_url: self.admin_url.clone(),
            dropped: false,
        })
    }
}

/// A database that exists for one test; dropped with the value.
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
    admin_url: String,
    dropped: bool,
}

impl TestDatabase {
    /// Its name (`agentloop_test_<32 hex digits>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A URL to connect to it: the admin URL with its database replaced.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Drops the database now, reporting failure (dropping the value does the same, but
    /// can only print a failure).
    pub async fn drop_database(mut self) -> Result<(), sqlx::Error> {
        self.dropped = true;
        drop_database(&self.admin_url, &self.name).await
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // `Drop` cannot await, and the test's runtime may be single-threaded (blocking it
        // would deadlock): drop the database from a thread with a runtime of its own.
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        let joined = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime
                .block_on(drop_database(&admin_url, &name))
                .map_err(|e| e.to_string())
        })
        .join();
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(error)) => loud(&format!(
                "could not drop test database {}: {error}",
                self.name
            )),
            Err(_) => loud(&format!("dropping test database {} panicked", self.name)),
        }
    }
}

async fn drop_database(admin_url: &str, name: &str) -> Result<(), sqlx::Error> {
    let mut conn = admin_connection(admin_url).await?;
    // `name` was made by `create_database` (prefix + hex).
    sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut conn)
    .await?;
    conn.close().await
}

async fn admin_connection(url: &str) -> Result<PgConnection, sqlx::Error> {
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect(url)).await {
        Ok(connected) => connected,
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no connection within {CONNECT_TIMEOUT:?}"),
        ))),
    }
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

/// `url` with its database (the path) replaced by `database`, keeping user, password,
/// host, port and query parameters.
fn url_with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |index| index + 3);
    let base = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{database}?{query}"),
        None => format!("{base}/{database}"),
    }
}

/// `url` without its password, for messages.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|index| index + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!(
                "{}{user}:***@{host}{}",
                &url[..scheme_end],
                &rest[authority_end..]
            ),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{redact, url_with_database};

    #[test]
    fn the_database_of_a_url_is_replaced() {
        let cases = [
            (
                "postgres://postgres@127.0.0.1:5432/postgres",
                "postgres://postgres@127.0.0.1:5432/db",
            ),
            (
                "postgres://u:p@host/admin?sslmode=disable",
                "postgres://u:p@host/db?sslmode=disable",
            ),
            ("postgres://host:5432", "postgres://host:5432/db"),
            (
                "postgres://host?sslmode=require",
                "postgres://host/db?sslmode=require",
            ),
            ("postgresql://host/", "postgresql://host/db"),
        ];
        for (url, expected) in cases {
            assert_eq!(url_with_database(url, "db"), expected, "{url}");
        }
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://user:secret@host:5432/db"),
            "postgres://user:***@host:5432/db"
        );
        assert_eq!(redact("postgres://user@host/db"), "postgres://user@host/db");
        assert_eq!(redact("not a url"), "not a url");
    }
}
