//! The embedded backend: one SQLite file in WAL mode.
//!
//! Writers serialize on SQLite's single write lock: every write transaction starts with
//! `BEGIN IMMEDIATE`, so the read-check-write of `create` and `append` cannot interleave
//! with another writer (no lost update, no lock-upgrade deadlock), and the busy timeout
//! makes a second writer wait instead of failing.
//!
//! Unsigned counters and times are stored as SQLite INTEGER (i64); see `codec` for the
//! conversions both backends share.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentloop_engine::Totals;
use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{FromRow, Row, Sqlite, Transaction};
use uuid::Uuid;

use crate::codec::{
    CREATE_ATTEMPTS, EventColumns, InvocationColumns, MAX_EVENTS_PAGE, counter_to_i64,
    encode_events, ended_record, fresh_record, from_seq_to_i64, idempotent_answer,
    is_unique_violation, parse_id, parse_state, state_text, stored_u64, time_to_i64, to_json,
};
use crate::{
    Append, Created, EventStore, InvocationRecord, InvocationState, ListRequest, MAX_PAGE_SIZE,
    NewInvocation, StoreError, StoredEvent,
};

/// The schema, embedded at compile time so a binary carries its own migrations.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

/// How long a writer waits for SQLite's write lock before the operation fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The name of the database file [`SqliteStore::open_in`] uses.
pub const DATABASE_FILE: &str = "events.db";

/// How to open a [`SqliteStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// The database file; it and its parent directory are created if missing.
    pub path: PathBuf,
    /// `synchronous=FULL` (the default): a committed append survives power failure.
    /// `false` selects `NORMAL`: faster, but a committed turn may be lost on power failure
    /// (never on a process crash).
    pub synchronous_full: bool,
    /// Size of the connection pool (readers run in parallel; writers still serialize).
    pub max_connections: u32,
}

impl SqliteOptions {
    /// The durable defaults for a database at `path`.
    pub fn new(path: impl Into<PathBuf>) -> SqliteOptions {
        SqliteOptions {
            path: path.into(),
            synchronous_full: true,
            max_connections: 4,
        }
    }
}

/// What the open connection reports about durability, for a startup log line and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteDurability {
    /// `PRAGMA journal_mode` (`wal` when opened by [`SqliteStore::open`]).
    pub journal_mode: String,
    /// `PRAGMA synchronous`: 1 = NORMAL, 2 = FULL.
    pub synchronous: i64,
}

/// The SQLite [`EventStore`]. Cheap to clone (a shared connection pool).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if needed) the database and brings its schema up to date.
    pub async fn open(options: SqliteOptions) -> Result<SqliteStore, StoreError> {
        if let Some(parent) = options.path.parent()
            && !parent.as_os_str().is_empty()
        {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
        }
        let synchronous = if options.synchronous_full {
            SqliteSynchronous::Full
        } else {
            SqliteSynchronous::Normal
        };
        let connect = SqliteConnectOptions::new()
            .filename(&options.path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .connect_with(connect)
            .await?;
        MIGRATOR.run(&pool).await?;
        tracing::debug!(path = %options.path.display(), "event store opened");
        Ok(SqliteStore { pool })
    }

    /// Opens `<dir>/events.db` with the durable defaults.
    pub async fn open_in(dir: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open(SqliteOptions::new(dir.join(DATABASE_FILE))).await
    }

    /// The journal mode and synchronous level a connection of this store runs with.
    pub async fn durability(&self) -> Result<SqliteDurability, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let journal_mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut *conn)
            .await?;
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await?;
        Ok(SqliteDurability {
            journal_mode,
            synchronous,
        })
    }

    /// Closes every connection (checkpointing the WAL); waits for ones in use.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Starts a write transaction holding SQLite's write lock from its first statement.
    async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }
}

/// The columns `decode_invocation` reads, as a literal so queries stay `&'static str`.
macro_rules! select_invocation {
    () => {
        "SELECT invocation_id, idempotency_key, request_digest, spec, state, version, \
         lease_epoch, totals, end_record, created_at, updated_at FROM invocations"
    };
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn create(&self, new: NewInvocation) -> Result<Created, StoreError> {
        let id_text = new.invocation_id.hyphenated().to_string();
        let totals = to_json(&Totals::default())?;
        let created_at = time_to_i64(new.created_at);
        let mut last_error = None;
        for _ in 0..CREATE_ATTEMPTS {
            let mut tx = self.begin_write().await?;
            if let Some(key) = &new.idempotency_key
                && let Some(existing) = find_by_key(&mut tx, key).await?
            {
                return idempotent_answer(&new, key, existing);
            }
            let inserted = sqlx::query(
                "INSERT INTO invocations (invocation_id, idempotency_key, request_digest, spec, \
                 state, version, lease_epoch, totals, end_record, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, 'running', 0, 0, ?, NULL, ?, ?)",
            )
            .bind(&id_text)
            .bind(new.idempotency_key.as_deref())
            .bind(&new.request_digest)
            .bind(&new.spec)
            .bind(&totals)
            .bind(created_at)
            .bind(created_at)
            .execute(&mut *tx)
            .await;
            match inserted {
                Ok(_) => {
                    tx.commit().await?;
                    return Ok(Created::New(fresh_record(new)));
                }
                Err(error) if is_unique_violation(&error) && new.idempotency_key.is_some() => {
                    // Another writer stored the same key between our lookup and insert
                    // (impossible under BEGIN IMMEDIATE, kept for safety): look again.
                    drop(tx);
                    last_error = Some(error);
                }
                Err(error) => return Err(error.into()),
            }
        }
        Err(match last_error {
            Some(error) => error.into(),
            None => StoreError::Corrupt("create retried without an error".to_owned()),
        })
    }

    async fn get(&self, invocation_id: Uuid) -> Result<InvocationRecord, StoreError> {
        let row = sqlx::query(concat!(select_invocation!(), " WHERE invocation_id = ?"))
            .bind(invocation_id.hyphenated().to_string())
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => decode_invocation(&row),
            None => Err(StoreError::NotFound(invocation_id)),
        }
    }

    async fn list(&self, request: ListRequest) -> Result<Vec<InvocationRecord>, StoreError> {
        let limit = i64::from(request.limit.min(MAX_PAGE_SIZE));
        let before = request.before.map(|id| id.hyphenated().to_string());
        let state = request.state.map(state_text);
        // Four static queries rather than `? IS NULL OR ...`, so each can use its index.
        let query = match (&before, &state) {
            (None, None) => sqlx::query(concat!(
                select_invocation!(),
                " ORDER BY invocation_id DESC LIMIT ?"
            )),
            (Some(before), None) => sqlx::query(concat!(
                select_invocation!(),
                " WHERE invocation_id < ? ORDER BY invocation_id DESC LIMIT ?"
            ))
            .bind(before),
            (None, Some(state)) => sqlx::query(concat!(
                select_invocation!(),
                " WHERE state = ? ORDER BY invocation_id DESC LIMIT ?"
            ))
            .bind(*state),
            (Some(before), Some(state)) => sqlx::query(concat!(
                select_invocation!(),
                " WHERE state = ? AND invocation_id < ? ORDER BY invocation_id DESC LIMIT ?"
            ))
            .bind(*state)
            .bind(before),
        };
        let rows = query.bind(limit).fetch_all(&self.pool).await?;
        rows.iter().map(decode_invocation).collect()
    }

    async fn append(&self, invocation_id: Uuid, append: Append<'_>) -> Result<(), StoreError> {
        // Everything that can be checked without the database is checked before the write
        // lock is taken.
        let rows = encode_events(&append)?;
        let end = ended_record(append.events)?;
        let lease_epoch = counter_to_i64(append.lease_epoch, "lease epoch")?;
        let totals = to_json(&append.totals)?;
        let end_json = end.map(to_json).transpose()?;
        let committed_at = time_to_i64(append.committed_at);
        let new_version = rows.last().map_or(0, |(seq, _)| *seq);
        let id_text = invocation_id.hyphenated().to_string();

        let mut tx = self.begin_write().await?;
        let row = sqlx::query(
            "SELECT state, version, lease_epoch FROM invocations WHERE invocation_id = ?",
        )
        .bind(&id_text)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Err(StoreError::NotFound(invocation_id));
        };
        let state = parse_state(&row.try_get::<String, _>("state")?, invocation_id)?;
        let version = stored_u64(row.try_get("version")?, "version", invocation_id)?;
        let current_epoch = stored_u64(row.try_get("lease_epoch")?, "lease_epoch", invocation_id)?;
        match state {
            InvocationState::Ended => return Err(StoreError::Ended(invocation_id)),
            InvocationState::Running => {}
        }
        if append.lease_epoch < current_epoch {
            return Err(StoreError::StaleEpoch {
                invocation_id,
                presented: append.lease_epoch,
                current: current_epoch,
            });
        }
        if append.expected_version != version {
            return Err(StoreError::VersionConflict {
                invocation_id,
                expected: append.expected_version,
                actual: version,
            });
        }
        for (seq, body) in &rows {
            sqlx::query(
                "INSERT INTO events (invocation_id, seq, committed_at, body) VALUES (?, ?, ?, ?)",
            )
            .bind(&id_text)
            .bind(*seq)
            .bind(committed_at)
            .bind(body)
            .execute(&mut *tx)
            .await?;
        }
        let state = if end_json.is_some() {
            InvocationState::Ended
        } else {
            InvocationState::Running
        };
        sqlx::query(
            "UPDATE invocations SET version = ?, lease_epoch = ?, totals = ?, state = ?, \
             end_record = ?, updated_at = ? WHERE invocation_id = ?",
        )
        .bind(new_version)
        .bind(lease_epoch)
        .bind(&totals)
        .bind(state_text(state))
        .bind(end_json.as_deref())
        .bind(committed_at)
        .bind(&id_text)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn events(
        &self,
        invocation_id: Uuid,
        from_seq: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let id_text = invocation_id.hyphenated().to_string();
        let from = from_seq_to_i64(from_seq);
        let limit = i64::from(limit.min(MAX_EVENTS_PAGE));
        let rows = sqlx::query(
            "SELECT seq, committed_at, body FROM events \
             WHERE invocation_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
        )
        .bind(&id_text)
        .bind(from)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        if rows.is_empty() {
            let exists: Option<i64> =
                sqlx::query_scalar("SELECT 1 FROM invocations WHERE invocation_id = ?")
                    .bind(&id_text)
                    .fetch_optional(&self.pool)
                    .await?;
            if exists.is_none() {
                return Err(StoreError::NotFound(invocation_id));
            }
        }
        rows.iter()
            .map(|row| decode_event(row, invocation_id))
            .collect()
    }

    async fn running(&self, limit: u32) -> Result<Vec<Uuid>, StoreError> {
        let limit = i64::from(limit.min(MAX_PAGE_SIZE));
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT invocation_id FROM invocations WHERE state = 'running' \
             ORDER BY created_at, invocation_id LIMIT ?",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        ids.iter().map(|text| parse_id(text)).collect()
    }
}

async fn find_by_key(
    tx: &mut Transaction<'static, Sqlite>,
    key: &str,
) -> Result<Option<InvocationRecord>, StoreError> {
    let row = sqlx::query(concat!(select_invocation!(), " WHERE idempotency_key = ?"))
        .bind(key)
        .fetch_optional(&mut **tx)
        .await?;
    row.as_ref().map(decode_invocation).transpose()
}

fn decode_invocation(row: &SqliteRow) -> Result<InvocationRecord, StoreError> {
    InvocationColumns::from_row(row)?.into_record()
}

fn decode_event(row: &SqliteRow, invocation_id: Uuid) -> Result<StoredEvent, StoreError> {
    EventColumns::from_row(row)?.into_event(invocation_id)
}
