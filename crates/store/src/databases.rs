//! Databases of one's own on a PostgreSQL server: created under a fresh name, dropped
//! when done. `agentloop bench --mode cluster` runs its deployment on two of them, and the
//! tests of every crate that stores in PostgreSQL get theirs from `testing`, which is
//! built on this.
//!
//! A name is a prefix of the caller's (lowercase letters, digits and `_`) and 32 random
//! hex digits, so it never needs quoting and a leftover is easy to spot. A
//! [`Database`] drops its database when it is dropped, `WITH (FORCE)`, so connections
//! still open do not keep it alive.

use std::time::Duration;

use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// How long connecting to the server may take before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest prefix a database name may have (PostgreSQL's names hold 63 bytes).
const MAX_PREFIX_BYTES: usize = 63 - 32;

/// A database created by [`Database::create`]; dropped with the value.
#[derive(Debug)]
pub struct Database {
    name: String,
    url: String,
    admin_url: String,
    dropped: bool,
}

impl Database {
    /// Creates an empty database named `<prefix><32 hex digits>` on the server whose
    /// database `admin_url` names (that one is only used to create and drop others).
    ///
    /// # Errors
    ///
    /// A prefix that is not lowercase letters, digits and `_` (up to 31 bytes) is
    /// `sqlx::Error::Configuration`; an unreachable server or a refused `CREATE
    /// DATABASE` is the server's error.
    pub async fn create(admin_url: &str, prefix: &str) -> Result<Database, sqlx::Error> {
        let valid = prefix.len() <= MAX_PREFIX_BYTES
            && prefix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return Err(sqlx::Error::Configuration(
                format!("database prefix {prefix:?}: at most {MAX_PREFIX_BYTES} of a-z, 0-9, _")
                    .into(),
            ));
        }
        let name = format!("{prefix}{}", uuid::Uuid::new_v4().simple());
        let mut conn = connect(admin_url).await?;
        // The name was checked above and the rest is hex: safe to splice into the
        // statement, which takes no parameters for an identifier.
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        Ok(Database {
            url: url_with_database(admin_url, &name),
            name,
            admin_url: admin_url.to_owned(),
            dropped: false,
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A URL to connect to it: the admin URL with its database replaced.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Drops the database now, reporting failure (dropping the value does the same, but
    /// can only log a failure).
    ///
    /// # Errors
    ///
    /// The server's, when it is unreachable or refuses.
    pub async fn drop_database(mut self) -> Result<(), sqlx::Error> {
        self.dropped = true;
        drop_database(&self.admin_url, &self.name).await
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // `Drop` cannot await, and the caller's runtime may be single-threaded (blocking
        // it would deadlock): drop the database from a thread with a runtime of its own.
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
            Ok(Err(error)) => {
                tracing::warn!(database = %self.name, %error, "could not drop a database");
            }
            Err(_) => tracing::warn!(database = %self.name, "dropping a database panicked"),
        }
    }
}

async fn drop_database(admin_url: &str, name: &str) -> Result<(), sqlx::Error> {
    let mut conn = connect(admin_url).await?;
    // `name` was made by `Database::create`.
    sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut conn)
    .await?;
    conn.close().await
}

/// A connection to `url`, or a timed-out error after [`CONNECT_TIMEOUT`].
///
/// # Errors
///
/// The server's, or `Io(TimedOut)`.
pub async fn connect(url: &str) -> Result<PgConnection, sqlx::Error> {
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect(url)).await {
        Ok(connected) => connected,
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no connection within {CONNECT_TIMEOUT:?}"),
        ))),
    }
}

/// `url` with its database (the path) replaced by `database`, keeping user, password,
/// host, port and query parameters.
pub fn url_with_database(url: &str, database: &str) -> String {
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
pub fn redact(url: &str) -> String {
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

    use super::{Database, redact, url_with_database};

    #[tokio::test]
    async fn a_prefix_that_would_need_quoting_is_refused_before_connecting() {
        // Port 1 refuses connections: a configuration error proves nothing was sent.
        let long = "a".repeat(32);
        for prefix in ["Bench_", "a-b", "x; DROP DATABASE y; --", long.as_str()] {
            match Database::create("postgres://127.0.0.1:1/postgres", prefix).await {
                Err(sqlx::Error::Configuration(_)) => {}
                other => panic!("{prefix:?}: {other:?}"),
            }
        }
    }

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
