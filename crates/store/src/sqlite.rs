//! The embedded backend: one SQLite file in WAL mode.
//!
//! Every write goes through one writer task with its own connection (`writer`): it
//! commits the writes that queued up meanwhile in one `BEGIN IMMEDIATE` transaction with
//! one fsync (group commit), and acknowledges none before that. Reads use a pool of
//! other connections and run in parallel with it (WAL).
//!
//! Unsigned counters and times are stored as SQLite INTEGER (i64); see `codec` for the
//! conversions both backends share.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentloop_engine::{TerminalReason, UnixMillis};
use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, ConnectOptions, FromRow};
use uuid::Uuid;

use crate::codec::{
    Claim, Dialect, EventColumns, InvocationColumns, ListQuery, MAX_EVENTS_PAGE, claim_check,
    counter_to_i64, from_seq_to_i64, parse_id, time_to_i64,
};
use crate::writer::{SqliteStats, Writer, WriterHold};
use crate::{
    Append, Created, EventStore, InvocationRecord, InvocationState, ListRequest, MAX_PAGE_SIZE,
    NewInvocation, StoreError, StoredEvent,
};

/// The schema, embedded at compile time so a binary carries its own migrations.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

/// How long a connection waits for SQLite's lock before the operation fails (only the
/// writer writes, so this covers another process holding the file and checkpoints).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The writer's page cache, as SQLite's `cache_size` pragma (negative: KiB), 1 MiB
/// (half SQLite's default). It holds the hot pages (the end of the events index, the rows
/// of the invocations committing now). It fills up to its size as the database grows, so
/// every MiB of it is resident, and most of it is the events' pages just appended, which
/// the writer does not read again: 16 MiB bought no throughput over 4 in
/// `agentloop bench`, nor 4 over 2, nor 2 over 1.
const WRITER_CACHE_KIB: &str = "-1024";

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
    /// Size of the pool of reading connections (they run in parallel); every write goes
    /// through one more connection of its own.
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

/// What [`SqliteStore::storage`] reports: the size of the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqliteStorage {
    /// Bytes of the pages in use (tables, indexes, free space inside pages; not the
    /// free list), as of the last commit, WAL included.
    pub used_bytes: u64,
    /// Committed events.
    pub events: u64,
    /// Bytes of the events' bodies alone (their JSON text).
    pub event_body_bytes: u64,
}

/// The SQLite [`EventStore`]. Cheap to clone (a shared reading pool and one writer).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    writer: Arc<Writer>,
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
            .connect_with(connect.clone())
            .await?;
        MIGRATOR.run(&pool).await?;
        // The writer's connection:
        // - a page cache of a set size, whatever the default of the SQLite it runs on;
        // - no automatic checkpoint: the writer has checkpoints run beside it;
        // - statement journals (kept by multi-row statements in case they must be undone
        //   halfway) in memory, which costs no system calls.
        let writer = connect
            .pragma("cache_size", WRITER_CACHE_KIB)
            .pragma("wal_autocheckpoint", "0")
            .pragma("temp_store", "memory")
            .connect()
            .await?;
        let writer = Writer::start(writer, pool.clone())
            .map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
        tracing::debug!(path = %options.path.display(), "event store opened");
        Ok(SqliteStore {
            pool,
            writer: Arc::new(writer),
        })
    }

    /// Opens `<dir>/events.db` with the durable defaults.
    pub async fn open_in(dir: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open(SqliteOptions::new(dir.join(DATABASE_FILE))).await
    }

    /// For tests of group commit: holds the writer inside a group until the hold is
    /// released, so that the writes issued meanwhile queue up and are committed together,
    /// as under load. Every write waits while the hold lasts.
    ///
    /// # Errors
    ///
    /// The writer stopped.
    pub async fn hold_writer(&self) -> Result<WriterHold, StoreError> {
        self.writer.hold().await
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

    /// Commits the writes already queued, then closes every connection (checkpointing
    /// the WAL); waits for ones in use. Writes after this fail.
    pub async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
    }

    /// What the writer has done: commits (fsyncs), appends and other writes.
    pub fn stats(&self) -> SqliteStats {
        self.writer.stats()
    }

    /// The size of the database and of the events in it.
    pub async fn storage(&self) -> Result<SqliteStorage, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
            .fetch_one(&mut *conn)
            .await?;
        let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
            .fetch_one(&mut *conn)
            .await?;
        let free: i64 = sqlx::query_scalar("PRAGMA freelist_count")
            .fetch_one(&mut *conn)
            .await?;
        let (events, body_bytes): (i64, i64) =
            sqlx::query_as("SELECT count(*), coalesce(sum(length(body)), 0) FROM events")
                .fetch_one(&mut *conn)
                .await?;
        let unsigned = |value: i64| u64::try_from(value).unwrap_or(0);
        Ok(SqliteStorage {
            used_bytes: unsigned(pages.saturating_sub(free)).saturating_mul(unsigned(page_size)),
            events: unsigned(events),
            event_body_bytes: unsigned(body_bytes),
        })
    }
}

/// The columns `decode_invocation` reads, as a literal so queries stay `&'static str`.
macro_rules! select_invocation {
    () => {
        "SELECT invocation_id, tenant, idempotency_key, request_digest, spec, state, version, \
         lease_epoch, totals, end_record, cancel_requested_at, cancel_reason, created_at, \
         updated_at FROM invocations JOIN invocation_specs USING (invocation_id)"
    };
}

/// The same, for the writer's queries built at run time.
pub(crate) const SELECT_INVOCATION: &str = select_invocation!();

#[async_trait]
impl EventStore for SqliteStore {
    async fn create(&self, new: NewInvocation) -> Result<Created, StoreError> {
        // The writer checks the key and inserts in one transaction on the only writing
        // connection, so no other create can store the same key in between.
        self.writer.create(new).await
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
        let page = ListQuery::new(&request, Dialect::Sqlite);
        let sql = format!("{SELECT_INVOCATION}{}", page.clauses);
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for value in page.values {
            query = query.bind(value);
        }
        let rows = query.bind(limit).fetch_all(&self.pool).await?;
        rows.iter().map(decode_invocation).collect()
    }

    async fn append(&self, invocation_id: Uuid, append: Append<'_>) -> Result<(), StoreError> {
        self.writer.append(invocation_id, &append).await
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

    async fn running(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<Uuid>, StoreError> {
        let limit = i64::from(limit.min(MAX_PAGE_SIZE));
        // The empty string sorts before every hyphenated ID.
        let after = after
            .map(|id| id.hyphenated().to_string())
            .unwrap_or_default();
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT invocation_id FROM invocations \
             WHERE state = 'running' AND invocation_id > ? ORDER BY invocation_id LIMIT ?",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        ids.iter().map(|text| parse_id(text)).collect()
    }

    async fn claim(
        &self,
        invocation_id: Uuid,
        lease_epoch: u64,
    ) -> Result<InvocationRecord, StoreError> {
        let epoch = counter_to_i64(lease_epoch, "lease epoch")?;
        self.writer
            .session(move |conn| {
                Box::pin(async move {
                    let mut record = locked_record(conn, invocation_id).await?;
                    match claim_check(&record, lease_epoch)? {
                        Claim::Unchanged => return Ok(record),
                        Claim::Raise => {}
                    }
                    sqlx::query("UPDATE invocations SET lease_epoch = ? WHERE invocation_id = ?")
                        .bind(epoch)
                        .bind(invocation_id.hyphenated().to_string())
                        .execute(&mut *conn)
                        .await?;
                    record.lease_epoch = lease_epoch;
                    Ok(record)
                })
            })
            .await
    }

    async fn request_cancel(
        &self,
        invocation_id: Uuid,
        at: UnixMillis,
        reason: &str,
    ) -> Result<InvocationRecord, StoreError> {
        let reason = reason.to_owned();
        self.writer
            .session(move |conn| {
                Box::pin(async move {
                    let mut record = locked_record(conn, invocation_id).await?;
                    if record.state == InvocationState::Ended
                        || record.cancel_requested_at.is_some()
                    {
                        return Ok(record);
                    }
                    sqlx::query(
                        "UPDATE invocations SET cancel_requested_at = ?, cancel_reason = ? \
                         WHERE invocation_id = ?",
                    )
                    .bind(time_to_i64(at))
                    .bind(&reason)
                    .bind(invocation_id.hyphenated().to_string())
                    .execute(&mut *conn)
                    .await?;
                    record.cancel_requested_at = Some(at);
                    record.cancel_reason = reason;
                    Ok(record)
                })
            })
            .await
    }

    async fn expired_waits(&self, now: UnixMillis, limit: u32) -> Result<Vec<Uuid>, StoreError> {
        let limit = i64::from(limit.min(MAX_PAGE_SIZE));
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT invocation_id FROM invocations \
             WHERE state = 'waiting' AND wait_until <= ? ORDER BY wait_until LIMIT ?",
        )
        .bind(time_to_i64(now))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        ids.iter().map(|text| parse_id(text)).collect()
    }

    async fn count_waiting(&self) -> Result<Vec<(TerminalReason, u64)>, StoreError> {
        let rows = sqlx::query_as(
            "SELECT json_extract(end_record, '$.reason'), COUNT(*) FROM invocations \
             WHERE state = 'waiting' GROUP BY 1",
        )
        .fetch_all(&self.pool)
        .await?;
        crate::waiting_counts(rows)
    }
}

/// The invocation, read on the writer's connection inside its transaction (which holds
/// SQLite's write lock).
async fn locked_record(
    conn: &mut SqliteConnection,
    invocation_id: Uuid,
) -> Result<InvocationRecord, StoreError> {
    let row = sqlx::query(concat!(select_invocation!(), " WHERE invocation_id = ?"))
        .bind(invocation_id.hyphenated().to_string())
        .fetch_optional(&mut *conn)
        .await?;
    match row {
        Some(row) => decode_invocation(&row),
        None => Err(StoreError::NotFound(invocation_id)),
    }
}

pub(crate) fn decode_invocation(row: &SqliteRow) -> Result<InvocationRecord, StoreError> {
    InvocationColumns::from_row(row)?.into_record()
}

fn decode_event(row: &SqliteRow, invocation_id: Uuid) -> Result<StoredEvent, StoreError> {
    EventColumns::from_row(row)?.into_event(invocation_id)
}
