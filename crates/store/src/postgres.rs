//! The shared backend: PostgreSQL, for several orchestrator processes on several machines.
//!
//! Appends are group-committed (`pg_commit`): the appends of many invocations that are
//! ready at once go in one statement, whose `UPDATE` checks each row's state, version and
//! lease epoch under its row lock, so a second writer of the same invocation waits for the
//! first to commit, then sees the version it left and is refused. `claim` is one statement
//! whose `UPDATE` holds its rule, and locks the row with `SELECT ... FOR UPDATE` only when
//! another claim raced it; `request_cancel` locks the row for its read-check-write.
//! `create` relies on the unique idempotency key instead: `INSERT ... ON CONFLICT
//! (idempotency_key) DO NOTHING` waits for a concurrent insert of the same key to commit,
//! then the existing row is selected.
//!
//! Every session runs with `synchronous_commit = on` whatever the server's default, so an
//! `Ok` from `append` means the commit is flushed to the server's WAL; and with a
//! `lock_timeout`, so a writer stuck behind a lock fails instead of waiting forever.
//! Counters and times are BIGINT, JSON is TEXT (see the migration for why not JSONB).

use std::str::FromStr;
use std::time::Duration;

use agentloop_engine::{TerminalReason, Totals, UnixMillis};
use async_trait::async_trait;
use sqlx::Connection;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, FromRow, Postgres, Row, Transaction};
use uuid::Uuid;

use crate::codec::{
    CREATE_ATTEMPTS, Claim, Dialect, EventColumns, InvocationColumns, ListQuery, MAX_EVENTS_PAGE,
    claim_check, counter_to_i64, fresh_record, from_seq_to_i64, idempotent_answer, parse_id,
    scoped_key, stored_u64, time_to_i64, to_json,
};
use crate::pg_commit::{Committer, PgCommitHold, PgCommitStats};
use crate::{
    Append, Created, EventStore, InvocationRecord, InvocationState, ListRequest, MAX_PAGE_SIZE,
    NewInvocation, StoreError, StoredEvent,
};

/// The schema, embedded at compile time so a binary carries its own migrations. sqlx takes
/// an advisory lock while migrating, so processes starting together do not race.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

/// How long an operation waits for a connection from the pool (this also bounds the
/// connect when the server is unreachable).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a statement waits for a row lock before the operation fails: the same bound
/// SQLite's busy timeout gives.
const LOCK_TIMEOUT: &str = "5s";

/// How long a pooled connection may sit idle before it is pinged when next lent. A busy
/// pool lends connections idle for microseconds and pings none (a ping is a round trip
/// per use), while a connection left idle across a server restart or a dropped TCP
/// connection is found out before a statement fails on it, and with it a whole group.
pub const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// The pool every PostgreSQL client of agentloop uses (the event store's, its group
/// commit's, the effect ledger's): at most `max_connections` (at least one), waiting at
/// most `acquire_timeout` for one, pinging only those idle beyond [`PING_AFTER_IDLE`].
pub fn pg_pool_options(max_connections: u32, acquire_timeout: Duration) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(acquire_timeout)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for < PING_AFTER_IDLE {
                    return Ok(true);
                }
                // One that does not answer is closed, and the pool lends another.
                Ok(conn.ping().await.is_ok())
            })
        })
}

/// The connection pool size [`PgOptions::new`] picks.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;

/// How to connect a [`PgStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOptions {
    /// A libpq-style URL, `postgres://user[:password]@host[:port]/database[?sslmode=...]`.
    /// The database must exist; its schema is brought up to date on connect.
    pub url: String,
    /// Size of the connection pool (appends to different invocations run in parallel).
    pub max_connections: u32,
}

impl PgOptions {
    /// The defaults for the database at `url`.
    pub fn new(url: impl Into<String>) -> PgOptions {
        PgOptions {
            url: url.into(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// The PostgreSQL [`EventStore`]. Cheap to clone (a shared connection pool).
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    commits: Committer,
}

/// Writes the claims of a `raised` CTE (the rows whose epoch a claim raised) to the
/// fencing trail, `lease_claims`, in the statement that raises them: the claim and its
/// trail commit together, and the trail's position is taken under the row's lock.
macro_rules! record_claim {
    () => {
        "INSERT INTO lease_claims (invocation_id, lease_epoch) \
         SELECT invocation_id, lease_epoch FROM raised"
    };
}

/// One step of the fencing trail ([`PgStore::fencing_trail`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrailEntry {
    /// Where it took effect among all claims and commits.
    pub position: u64,
    /// The invocation.
    pub invocation_id: Uuid,
    /// The epoch claimed, or the epoch that committed the event.
    pub lease_epoch: u64,
    /// The event's seq; `None` for a claim.
    pub seq: Option<u64>,
}

impl PgStore {
    /// Connects to the database and brings its schema up to date.
    pub async fn connect(options: PgOptions) -> Result<PgStore, StoreError> {
        let mut connect = PgConnectOptions::from_str(&options.url)?
            .options([("synchronous_commit", "on"), ("lock_timeout", LOCK_TIMEOUT)]);
        if connect.get_application_name().is_none() {
            connect = connect.application_name("agentloop-store");
        }
        let pool = pg_pool_options(options.max_connections, ACQUIRE_TIMEOUT)
            .connect_with(connect.clone())
            .await?;
        MIGRATOR.run(&pool).await?;
        tracing::debug!(
            database = pool.connect_options().get_database().unwrap_or_default(),
            "event store connected"
        );
        let commits = Committer::start(connect, ACQUIRE_TIMEOUT)
            .map_err(|error| StoreError::Database(sqlx::Error::Io(error)))?;
        Ok(PgStore { pool, commits })
    }

    /// `claim` as a transaction that locks the row first: for a claim that raced another.
    async fn claim_locked(
        &self,
        invocation_id: Uuid,
        lease_epoch: u64,
    ) -> Result<InvocationRecord, StoreError> {
        let epoch = counter_to_i64(lease_epoch, "lease epoch")?;
        let mut tx = self.pool.begin().await?;
        let mut record = locked_record(&mut tx, invocation_id).await?;
        match claim_check(&record, lease_epoch)? {
            Claim::Unchanged => return Ok(record),
            Claim::Raise => {}
        }
        sqlx::query(concat!(
            "WITH raised AS (UPDATE invocations SET lease_epoch = $1 WHERE invocation_id = $2::uuid \
             RETURNING invocation_id, lease_epoch) ",
            record_claim!()
        ))
        .bind(epoch)
        .bind(invocation_id.hyphenated().to_string())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        record.lease_epoch = lease_epoch;
        Ok(record)
    }

    /// A page of the fencing trail: every claim of a lease epoch and every committed event
    /// with the epoch that committed it, after `after` in the order they took effect. An
    /// outside checker reads it to show that no event was committed under an epoch older
    /// than the last claim before it (`agentloop chaos`).
    ///
    /// # Errors
    ///
    /// The database's, or a row out of range.
    pub async fn fencing_trail(
        &self,
        after: u64,
        limit: u32,
    ) -> Result<Vec<TrailEntry>, StoreError> {
        let after = counter_to_i64(after, "trail position")?;
        let limit = i64::from(limit.min(MAX_PAGE_SIZE));
        let rows = sqlx::query(
            "(SELECT position, invocation_id::text AS id, lease_epoch, NULL::bigint AS seq \
                 FROM lease_claims WHERE position > $1 ORDER BY position LIMIT $2) \
             UNION ALL \
             (SELECT position, invocation_id::text, lease_epoch, seq \
                 FROM events WHERE position > $1 ORDER BY position LIMIT $2) \
             ORDER BY position LIMIT $2",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let id = parse_id(&row.try_get::<String, _>("id")?)?;
                let position = stored_u64(row.try_get("position")?, "position", id)?;
                let lease_epoch = stored_u64(row.try_get("lease_epoch")?, "lease_epoch", id)?;
                let seq = match row.try_get::<Option<i64>, _>("seq")? {
                    Some(seq) => Some(stored_u64(seq, "seq", id)?),
                    None => None,
                };
                Ok(TrailEntry {
                    position,
                    invocation_id: id,
                    lease_epoch,
                    seq,
                })
            })
            .collect()
    }

    /// What the group commit did so far.
    pub fn commit_stats(&self) -> PgCommitStats {
        self.commits.stats()
    }

    /// Holds the group commit: appends queue up until the hold is released, then go to
    /// the database together. For tests of what one group does.
    ///
    /// # Errors
    ///
    /// The store is closed.
    pub async fn hold_commits(&self) -> Result<PgCommitHold, StoreError> {
        self.commits.hold().await
    }

    /// The `synchronous_commit` setting a connection of this store runs with (`on`), for a
    /// startup log line and tests.
    pub async fn synchronous_commit(&self) -> Result<String, StoreError> {
        Ok(sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&self.pool)
            .await?)
    }

    /// Closes every connection; waits for ones in use.
    pub async fn close(&self) {
        self.pool.close().await;
        self.commits.close().await;
    }
}

/// The columns `InvocationColumns` reads, as a literal so queries stay `&'static str`.
/// The ID is read as text so both backends decode the same columns.
macro_rules! select_invocation {
    () => {
        "SELECT invocation_id::text AS invocation_id, tenant, idempotency_key, request_digest, spec, \
         state, version, lease_epoch, totals, end_record, cancel_requested_at, cancel_reason, \
         created_at, updated_at FROM invocations JOIN invocation_specs USING (invocation_id)"
    };
}

#[async_trait]
impl EventStore for PgStore {
    async fn create(&self, new: NewInvocation) -> Result<Created, StoreError> {
        let id_text = new.invocation_id.hyphenated().to_string();
        let totals = to_json(&Totals::default())?;
        let created_at = time_to_i64(new.created_at);
        let key = new
            .idempotency_key
            .as_deref()
            .map(|key| scoped_key(&new.tenant, key));
        for _ in 0..CREATE_ATTEMPTS {
            // Without a key nothing can conflict but the ID itself, which is an error.
            // One statement writes both rows, or neither when the key is taken.
            let inserted = sqlx::query(
                "WITH new AS (\
                 INSERT INTO invocations (invocation_id, idempotency_key, state, version, \
                 lease_epoch, totals, end_record, created_at, updated_at, tenant) \
                 VALUES ($1::uuid, $2, 'running', 0, 0, $5, NULL, $6, $6, $7) \
                 ON CONFLICT (idempotency_key) DO NOTHING RETURNING invocation_id) \
                 INSERT INTO invocation_specs (invocation_id, request_digest, spec) \
                 SELECT invocation_id, $3, $4 FROM new",
            )
            .bind(&id_text)
            .bind(key.as_deref())
            .bind(&new.request_digest)
            .bind(&new.spec)
            .bind(&totals)
            .bind(created_at)
            .bind(&new.tenant)
            .execute(&self.pool)
            .await?;
            if inserted.rows_affected() == 1 {
                return Ok(Created::New(fresh_record(new)));
            }
            let Some(key) = &key else {
                return Err(StoreError::Corrupt(format!(
                    "invocation {}: insert without an idempotency key stored nothing",
                    new.invocation_id
                )));
            };
            // The key is taken by a committed row (the insert waited for a concurrent one
            // to commit): this statement's fresh snapshot sees it, unless it was deleted
            // in between, in which case the insert is tried again.
            let existing =
                sqlx::query(concat!(select_invocation!(), " WHERE idempotency_key = $1"))
                    .bind(key)
                    .fetch_optional(&self.pool)
                    .await?;
            if let Some(row) = existing {
                return idempotent_answer(&new, decode_invocation(&row)?);
            }
        }
        Err(StoreError::Corrupt(format!(
            "idempotency key {:?} conflicted {CREATE_ATTEMPTS} times but no invocation holds it",
            new.idempotency_key.unwrap_or_default()
        )))
    }

    async fn get(&self, invocation_id: Uuid) -> Result<InvocationRecord, StoreError> {
        let row = sqlx::query(concat!(
            select_invocation!(),
            " WHERE invocation_id = $1::uuid"
        ))
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
        let page = ListQuery::new(&request, Dialect::Postgres);
        let sql = format!("{}{}", select_invocation!(), page.clauses);
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for value in page.values {
            query = query.bind(value);
        }
        let rows = query.bind(limit).fetch_all(&self.pool).await?;
        rows.iter().map(decode_invocation).collect()
    }

    async fn append(&self, invocation_id: Uuid, append: Append<'_>) -> Result<(), StoreError> {
        self.commits.append(invocation_id, &append).await
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
        // One statement: no row when the invocation is unknown, one row of NULLs when it
        // has no events from `from_seq` on (a new invocation's first watch).
        let rows = sqlx::query(
            "SELECT e.seq, e.committed_at, e.body FROM invocations AS i \
             LEFT JOIN LATERAL (SELECT seq, committed_at, body FROM events \
                 WHERE invocation_id = i.invocation_id AND seq >= $2 ORDER BY seq LIMIT $3) \
                 AS e ON true \
             WHERE i.invocation_id = $1::uuid ORDER BY e.seq",
        )
        .bind(&id_text)
        .bind(from)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        let Some(first) = rows.first() else {
            return Err(StoreError::NotFound(invocation_id));
        };
        if first.try_get::<Option<i64>, _>("seq")?.is_none() {
            return Ok(Vec::new());
        }
        rows.iter()
            .map(|row| EventColumns::from_row(row)?.into_event(invocation_id))
            .collect()
    }

    async fn running(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<Uuid>, StoreError> {
        let limit = i64::from(limit.min(MAX_PAGE_SIZE));
        // The nil UUID sorts before every real one.
        let after = after.unwrap_or(Uuid::nil()).hyphenated().to_string();
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT invocation_id::text FROM invocations \
             WHERE state = 'running' AND invocation_id > $1::uuid ORDER BY invocation_id LIMIT $2",
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
        // One statement: raise the epoch where the rule of `claim_check` says to, and read
        // the row as the statement found it.
        let row = sqlx::query(concat!(
            "WITH raised AS (UPDATE invocations SET lease_epoch = $2 \
             WHERE invocation_id = $1::uuid AND state = 'running' AND lease_epoch < $2 \
             RETURNING invocation_id, lease_epoch), claimed AS (",
            record_claim!(),
            ") SELECT found.*, EXISTS (SELECT 1 FROM raised) AS raised FROM (",
            select_invocation!(),
            " WHERE invocation_id = $1::uuid) AS found"
        ))
        .bind(invocation_id.hyphenated().to_string())
        .bind(epoch)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Err(StoreError::NotFound(invocation_id));
        };
        let mut record = decode_invocation(&row)?;
        if row.try_get::<bool, _>("raised")? {
            record.lease_epoch = lease_epoch;
            return Ok(record);
        }
        match claim_check(&record, lease_epoch)? {
            Claim::Unchanged => Ok(record),
            // Another claim raised the epoch after the statement's snapshot was taken:
            // read the row as it is now, under its lock.
            Claim::Raise => self.claim_locked(invocation_id, lease_epoch).await,
        }
    }

    async fn request_cancel(
        &self,
        invocation_id: Uuid,
        at: UnixMillis,
        reason: &str,
    ) -> Result<InvocationRecord, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut record = locked_record(&mut tx, invocation_id).await?;
        if record.state == InvocationState::Ended || record.cancel_requested_at.is_some() {
            return Ok(record);
        }
        sqlx::query(
            "UPDATE invocations SET cancel_requested_at = $1, cancel_reason = $2 \
             WHERE invocation_id = $3::uuid",
        )
        .bind(time_to_i64(at))
        .bind(reason)
        .bind(invocation_id.hyphenated().to_string())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        record.cancel_requested_at = Some(at);
        reason.clone_into(&mut record.cancel_reason);
        Ok(record)
    }

    async fn expired_waits(&self, now: UnixMillis, limit: u32) -> Result<Vec<Uuid>, StoreError> {
        let limit = i64::from(limit.min(MAX_PAGE_SIZE));
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT invocation_id::text FROM invocations \
             WHERE state = 'waiting' AND wait_until <= $1 ORDER BY wait_until LIMIT $2",
        )
        .bind(time_to_i64(now))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        ids.iter().map(|text| parse_id(text)).collect()
    }

    async fn count_waiting(&self) -> Result<Vec<(TerminalReason, u64)>, StoreError> {
        let rows = sqlx::query_as(
            "SELECT end_record::jsonb ->> 'reason', COUNT(*) FROM invocations \
             WHERE state = 'waiting' GROUP BY 1",
        )
        .fetch_all(&self.pool)
        .await?;
        crate::waiting_counts(rows)
    }
}

/// The invocation, locked for the rest of the transaction.
async fn locked_record(
    tx: &mut Transaction<'static, Postgres>,
    invocation_id: Uuid,
) -> Result<InvocationRecord, StoreError> {
    let row = sqlx::query(concat!(
        select_invocation!(),
        " WHERE invocation_id = $1::uuid FOR UPDATE OF invocations"
    ))
    .bind(invocation_id.hyphenated().to_string())
    .fetch_optional(&mut **tx)
    .await?;
    match row {
        Some(row) => decode_invocation(&row),
        None => Err(StoreError::NotFound(invocation_id)),
    }
}

fn decode_invocation(row: &PgRow) -> Result<InvocationRecord, StoreError> {
    InvocationColumns::from_row(row)?.into_record()
}
