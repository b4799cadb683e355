//! The durable ledger, on SQLite (the embedded default) or PostgreSQL (shared by several
//! orchestrator processes on several machines). [`LedgerStore`] is one type over both:
//! validation, the state machine and every SQL statement are the same text for both
//! backends (sqlx binds `$N` placeholders on SQLite too); only connecting, the migration
//! files (`migrations/sqlite`, `migrations/postgres`) and the durability settings differ.
//!
//! Durability: an entry that a call returned survives a power loss, which is the whole
//! point of the ledger. SQLite runs in WAL mode with `synchronous=FULL`; every PostgreSQL
//! session runs with `synchronous_commit=on` whatever the server's default.
//!
//! Every write is a single statement guarded by the state it expects (compare-and-set),
//! so two workers — or two ledger processes on the same database — cannot both move the
//! same effect, and a failed request leaves nothing behind. On PostgreSQL a second
//! `UPDATE` of the same row waits for the first to commit, then re-checks its `WHERE`
//! against the row the first left, so the loser matches nothing: the same outcome as
//! SQLite's single writer.

use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::error::LedgerError;
use crate::state::{self, Action, EffectState, Outcome};

/// Longest invocation ID, call ID, effect key, tool name or receipt, in bytes. IDs
/// are UUIDs or short names in practice; the bound keeps a buggy or hostile caller from
/// filling the database through them.
pub const MAX_ID_BYTES: usize = 1024;
/// Longest `detail`, in bytes: room for an error text, not for a tool's output.
pub const MAX_DETAIL_BYTES: usize = 64 * 1024;
/// Page size used when a listing (ListUnresolved, ListByInvocation) asks for 0.
pub const DEFAULT_PAGE_SIZE: u32 = 100;
/// Largest page a listing returns, whatever the request asks: bounds the memory and the
/// response size of one call, however many entries an invocation or a backlog has.
pub const MAX_PAGE_SIZE: u32 = 1000;
/// The table of applied PostgreSQL migrations. Not sqlx's default, so the ledger can
/// share a database with the event store, whose migrations are numbered independently.
pub const PG_MIGRATIONS_TABLE: &str = "_agentloop_ledger_migrations";

/// How long an operation waits for a PostgreSQL connection from the pool (this also
/// bounds the connect when the server is unreachable).
const PG_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// How the store is opened; the same knobs mean the same thing on both backends.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How long a write waits for another writer's lock before failing with a
    /// (retryable) error: SQLite's busy timeout, PostgreSQL's `lock_timeout`.
    pub busy_timeout: Duration,
    /// Pool size (SQLite serialises writers anyway; more only helps readers there).
    pub max_connections: u32,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            busy_timeout: Duration::from_secs(5),
            max_connections: 4,
        }
    }
}

/// One effect as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The invocation whose call caused the effect.
    pub invocation_id: String,
    /// The call ID of the tool call that carries the effect.
    pub call_id: String,
    /// Stable identity of the change.
    pub effect_key: String,
    /// How many times the effect has been dispatched; 0 while only prepared.
    pub attempt: u32,
    /// The tool that applies it.
    pub tool: String,
    /// Where it is in its life.
    pub state: EffectState,
    /// The executor's identifier of the applied change (COMMITTED only).
    pub receipt: String,
    /// Human-readable detail of the last transition.
    pub detail: String,
    /// When it was prepared.
    pub created_at: SystemTime,
    /// When it last changed state.
    pub updated_at: SystemTime,
}

impl Entry {
    /// The wire form.
    pub fn to_proto(&self) -> agentloop_proto::v1::EffectEntry {
        agentloop_proto::v1::EffectEntry {
            invocation_id: self.invocation_id.clone(),
            call_id: self.call_id.clone(),
            effect_key: self.effect_key.clone(),
            attempt: self.attempt,
            tool: self.tool.clone(),
            state: self.state.to_proto() as i32,
            receipt: self.receipt.clone(),
            created_at: Some(prost_types::Timestamp::from(self.created_at)),
            updated_at: Some(prost_types::Timestamp::from(self.updated_at)),
            detail: self.detail.clone(),
        }
    }
}

/// What Prepare records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEffect {
    /// The invocation whose call carries the effect.
    pub invocation_id: String,
    /// The call ID.
    pub call_id: String,
    /// The effect key (see [`crate::effect_key`] for the default derivation).
    pub effect_key: String,
    /// The tool that applies it.
    pub tool: String,
}

/// One page of a listing ([`LedgerStore::list_unresolved`],
/// [`LedgerStore::list_by_invocation`]). Both page the same way, by a cursor on the
/// preparation order, so a caller pages through either with the same loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The listed entries, oldest first.
    pub entries: Vec<Entry>,
    /// Pass back to get the next page; `None` on the last page.
    pub next_page_token: Option<String>,
}

/// Which database a [`LedgerStore`] is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// One SQLite file.
    Sqlite,
    /// A PostgreSQL database.
    Postgres,
}

/// The effect ledger on one database. Cheap to clone (a pool handle).
#[derive(Debug, Clone)]
pub struct LedgerStore {
    pool: Pool,
}

#[derive(Debug, Clone)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Runs `$body` with `$pool` bound to whichever pool the store has. The body is the same
/// tokens for both arms and is type-checked once per backend, which is what keeps the
/// two backends' statements identical.
macro_rules! on_pool {
    ($store:expr, |$pool:ident| $body:expr) => {
        match &$store.pool {
            Pool::Sqlite($pool) => $body,
            Pool::Postgres($pool) => $body,
        }
    };
}

/// The columns [`Row`] reads, in one place for every statement that returns entries.
macro_rules! columns {
    () => {
        "seq, effect_key, invocation_id, call_id, tool, state, attempt, \
         receipt, detail, created_at_ms, updated_at_ms"
    };
}

/// The unresolved states as an SQL list, the predicate of the partial indexes in both
/// schemas; a unit test checks it against [`EffectState::is_unresolved`].
macro_rules! unresolved_states {
    () => {
        "('PREPARED', 'DISPATCHED', 'OUTCOME_UNKNOWN', 'RECONCILIATION_REQUIRED')"
    };
}

/// A page of entries after a cursor, oldest first, narrowed by `$filter`. Every listing
/// binds the cursor as `$1` and the limit as `$2`, and an invocation (if any) as `$3`,
/// so the statements differ only in their filter.
macro_rules! page_after_cursor {
    ($($filter:tt)*) => {
        concat!(
            "SELECT ",
            columns!(),
            " FROM effects WHERE seq > $1",
            $($filter)*,
            " ORDER BY seq LIMIT $2"
        )
    };
}

/// What a listing returns. One enum rather than one function each, so the listings
/// cannot drift apart in validation, paging or page sizes. An index serves each (see the
/// migrations), so none scans the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listing<'a> {
    /// Unresolved entries of every invocation (`effects_unresolved_by_seq`).
    Unresolved,
    /// Unresolved entries of one invocation (`effects_unresolved_by_invocation`; SQLite's
    /// planner, which has no statistics to tell the two apart, takes
    /// `effects_by_invocation`, and skips the resolved entries row by row).
    UnresolvedOf(&'a str),
    /// Every entry of one invocation, in every state (`effects_by_invocation`).
    AllOf(&'a str),
}

impl<'a> Listing<'a> {
    /// The statement, with the binds [`page_after_cursor!`] describes.
    fn sql(self) -> &'static str {
        match self {
            Listing::Unresolved => page_after_cursor!(" AND state IN ", unresolved_states!()),
            Listing::UnresolvedOf(_) => page_after_cursor!(
                " AND invocation_id = $3 AND state IN ",
                unresolved_states!()
            ),
            Listing::AllOf(_) => page_after_cursor!(" AND invocation_id = $3"),
        }
    }

    /// The invocation the listing is narrowed to, bound as `$3`.
    fn invocation_id(self) -> Option<&'a str> {
        match self {
            Listing::Unresolved => None,
            Listing::UnresolvedOf(id) | Listing::AllOf(id) => Some(id),
        }
    }
}

#[derive(sqlx::FromRow)]
struct Row {
    seq: i64,
    effect_key: String,
    invocation_id: String,
    call_id: String,
    tool: String,
    state: String,
    attempt: i64,
    receipt: String,
    detail: String,
    created_at_ms: i64,
    updated_at_ms: i64,
}

impl LedgerStore {
    /// Opens (creating if missing) the ledger's SQLite file and applies pending
    /// migrations from `migrations/sqlite`.
    pub async fn open_sqlite(path: &Path, options: &StoreOptions) -> Result<Self, LedgerError> {
        let connect = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(options.busy_timeout)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .connect_with(connect)
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        Ok(Self {
            pool: Pool::Sqlite(pool),
        })
    }

    /// Connects to the PostgreSQL database at `url` (which must exist) and applies
    /// pending migrations from `migrations/postgres`. sqlx takes an advisory lock while
    /// migrating, so ledger processes starting together do not race.
    pub async fn connect_postgres(url: &str, options: &StoreOptions) -> Result<Self, LedgerError> {
        let lock_timeout = format!("{}ms", options.busy_timeout.as_millis().max(1));
        let mut connect = PgConnectOptions::from_str(url)?.options([
            ("synchronous_commit", "on"),
            ("lock_timeout", lock_timeout.as_str()),
        ]);
        if connect.get_application_name().is_none() {
            connect = connect.application_name("agentloop-ledger");
        }
        let pool = agentloop_store::pg_pool_options(options.max_connections, PG_ACQUIRE_TIMEOUT)
            .connect_with(connect)
            .await?;
        let mut migrator = sqlx::migrate!("./migrations/postgres");
        migrator.dangerous_set_table_name(PG_MIGRATIONS_TABLE);
        migrator.run(&pool).await?;
        Ok(Self {
            pool: Pool::Postgres(pool),
        })
    }

    /// Which database this store is on.
    pub fn backend(&self) -> Backend {
        match self.pool {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// The durability settings a connection of this store runs with, as the database
    /// reports them (`journal_mode=wal synchronous=full`, `synchronous_commit=on`): for
    /// the startup log line, so an operator sees what an `Ok` promises.
    pub async fn durability(&self) -> Result<String, LedgerError> {
        match &self.pool {
            Pool::Sqlite(pool) => {
                // One connection for both, since `synchronous` is per connection.
                let mut conn = pool.acquire().await?;
                let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
                    .fetch_one(&mut *conn)
                    .await?;
                let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
                    .fetch_one(&mut *conn)
                    .await?;
                let synchronous = match synchronous {
                    0 => "off",
                    1 => "normal",
                    2 => "full",
                    3 => "extra",
                    _ => "unknown",
                };
                Ok(format!("journal_mode={mode} synchronous={synchronous}"))
            }
            Pool::Postgres(pool) => {
                let setting: String = sqlx::query_scalar("SHOW synchronous_commit")
                    .fetch_one(pool)
                    .await?;
                Ok(format!("synchronous_commit={setting}"))
            }
        }
    }

    /// Waits for open connections to finish and closes them (for a clean shutdown).
    pub async fn close(&self) {
        on_pool!(self, |pool| pool.close().await)
    }

    /// Records an effect as PREPARED. Idempotent: the same key for the same
    /// invocation, call and tool returns the existing entry (`false` = not created);
    /// the same key for anything else is [`LedgerError::AlreadyExists`].
    pub async fn prepare(&self, new: &NewEffect) -> Result<(Entry, bool), LedgerError> {
        validate_id("invocation_id", &new.invocation_id)?;
        validate_id("call_id", &new.call_id)?;
        validate_id("effect_key", &new.effect_key)?;
        validate_id("tool", &new.tool)?;

        let now = now_ms();
        // A concurrent insert of the same key makes this one wait for it and then do
        // nothing (both backends), so exactly one caller sees `created`. The new entry
        // comes back from the insert itself: one statement in the usual case.
        let inserted: Option<Row> = on_pool!(self, |pool| {
            sqlx::query_as(concat!(
            "INSERT INTO effects \
               (effect_key, invocation_id, call_id, tool, state, attempt, created_at_ms, updated_at_ms) \
             VALUES ($1, $2, $3, $4, 'PREPARED', 0, $5, $5) \
             ON CONFLICT (effect_key) DO NOTHING RETURNING ",
            columns!()
        ))
        .bind(&new.effect_key)
        .bind(&new.invocation_id)
        .bind(&new.call_id)
        .bind(&new.tool)
        .bind(now)
        .fetch_optional(pool)
        .await?
        });
        if let Some(row) = inserted {
            return Ok((row.into_entry()?, true));
        }
        let entry = self.get(&new.effect_key).await?;
        if entry.invocation_id != new.invocation_id
            || entry.call_id != new.call_id
            || entry.tool != new.tool
        {
            return Err(LedgerError::AlreadyExists {
                effect_key: entry.effect_key,
                invocation_id: entry.invocation_id,
                call_id: entry.call_id,
                tool: entry.tool,
            });
        }
        Ok((entry, false))
    }

    /// Records that the effect is about to be dispatched (attempt + 1). `expected` is
    /// PREPARED, or OUTCOME_UNKNOWN after reconcile found the change not applied.
    pub async fn mark_dispatched(
        &self,
        effect_key: &str,
        expected: EffectState,
    ) -> Result<Entry, LedgerError> {
        validate_id("effect_key", effect_key)?;
        self.apply(effect_key, expected, Action::Dispatch, "", "")
            .await
    }

    /// Records an outcome. `expected` is DISPATCHED; OUTCOME_UNKNOWN when
    /// reconciliation settles the effect or hands it to an operator
    /// (RECONCILIATION_REQUIRED, which needs a `detail` saying why); or
    /// RECONCILIATION_REQUIRED when the operator settles it (see [`crate::state`]). A
    /// receipt may only accompany COMMITTED.
    pub async fn record(
        &self,
        effect_key: &str,
        expected: EffectState,
        outcome: Outcome,
        receipt: &str,
        detail: &str,
    ) -> Result<Entry, LedgerError> {
        validate_id("effect_key", effect_key)?;
        if receipt.len() > MAX_ID_BYTES {
            return Err(LedgerError::invalid(
                "receipt",
                format!("longer than {MAX_ID_BYTES} bytes"),
            ));
        }
        if !receipt.is_empty() && outcome != Outcome::Committed {
            return Err(LedgerError::invalid(
                "receipt",
                format!("only recorded with COMMITTED, not {}", outcome.state()),
            ));
        }
        if detail.len() > MAX_DETAIL_BYTES {
            return Err(LedgerError::invalid(
                "detail",
                format!("longer than {MAX_DETAIL_BYTES} bytes"),
            ));
        }
        if outcome == Outcome::ReconciliationRequired && detail.trim().is_empty() {
            return Err(LedgerError::invalid(
                "detail",
                "required with RECONCILIATION_REQUIRED: the operator needs to know why \
                 the executor could not tell",
            ));
        }
        self.apply(
            effect_key,
            expected,
            Action::Record(outcome),
            receipt,
            detail,
        )
        .await
    }

    /// How many entries are in each unresolved state (the states absent have none),
    /// counted over the index that serves the unresolved listing.
    pub async fn count_unresolved(&self) -> Result<Vec<(EffectState, u64)>, LedgerError> {
        let rows: Vec<(String, i64)> = on_pool!(self, |pool| sqlx::query_as(concat!(
            "SELECT state, COUNT(*) FROM effects WHERE state IN ",
            unresolved_states!(),
            " GROUP BY state"
        ))
        .fetch_all(pool)
        .await?);
        // The filter names only known states, so every row parses.
        Ok(rows
            .into_iter()
            .filter_map(|(state, count)| {
                Some((
                    EffectState::parse(&state)?,
                    u64::try_from(count).unwrap_or_default(),
                ))
            })
            .collect())
    }

    /// Returns one entry.
    pub async fn get(&self, effect_key: &str) -> Result<Entry, LedgerError> {
        validate_id("effect_key", effect_key)?;
        self.find(effect_key)
            .await?
            .ok_or_else(|| LedgerError::NotFound {
                effect_key: effect_key.to_owned(),
            })?
            .into_entry()
    }

    /// Lists unresolved entries (PREPARED, DISPATCHED, OUTCOME_UNKNOWN,
    /// RECONCILIATION_REQUIRED), oldest first, optionally of one invocation. `page_size`
    /// 0 means [`DEFAULT_PAGE_SIZE`]; larger than [`MAX_PAGE_SIZE`] is capped.
    /// `page_token` is the previous page's `next_page_token`; it is a cursor, so entries
    /// resolved between pages do not shift later pages.
    ///
    /// On PostgreSQL, an entry prepared *while* a listing pages through may be missed by
    /// that listing (sequence numbers are handed out before commit, so one can commit
    /// behind the cursor); it shows in the next listing. A resuming worker is not
    /// affected: it holds its invocation's lease, so nothing else prepares for it.
    pub async fn list_unresolved(
        &self,
        invocation_id: Option<&str>,
        page_size: u32,
        page_token: Option<&str>,
    ) -> Result<Page, LedgerError> {
        let listing = match invocation_id {
            Some(invocation_id) => Listing::UnresolvedOf(invocation_id),
            None => Listing::Unresolved,
        };
        self.list(listing, page_size, page_token).await
    }

    /// Lists every entry of one invocation, whatever its state, oldest first: what a
    /// final answer is checked against, so a write that is not COMMITTED shows up rather
    /// than being filtered away. Pages like [`Self::list_unresolved`] (same sizes, same
    /// tokens); an unknown invocation is an empty page, not an error, since an
    /// invocation that made no writes has no entries. The PostgreSQL caveat there holds
    /// here too, and the orchestrator is not affected by it for the same reason: it
    /// checks an invocation whose lease it holds.
    pub async fn list_by_invocation(
        &self,
        invocation_id: &str,
        page_size: u32,
        page_token: Option<&str>,
    ) -> Result<Page, LedgerError> {
        self.list(Listing::AllOf(invocation_id), page_size, page_token)
            .await
    }

    async fn list(
        &self,
        listing: Listing<'_>,
        page_size: u32,
        page_token: Option<&str>,
    ) -> Result<Page, LedgerError> {
        if let Some(invocation_id) = listing.invocation_id() {
            validate_id("invocation_id", invocation_id)?;
        }
        let after = match page_token {
            None => 0,
            Some(token) => decode_page_token(token)?,
        };
        let size = match page_size {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        // One extra row tells whether another page follows.
        let limit = i64::from(size) + 1;
        let mut rows: Vec<Row> = on_pool!(self, |pool| {
            let query = sqlx::query_as(listing.sql()).bind(after).bind(limit);
            match listing.invocation_id() {
                Some(invocation_id) => query.bind(invocation_id),
                None => query,
            }
            .fetch_all(pool)
            .await?
        });
        let more = rows.len() > size as usize;
        rows.truncate(size as usize);
        let next_page_token = match (more, rows.last()) {
            (true, Some(last)) => Some(encode_page_token(last.seq)),
            (true, None) | (false, _) => None,
        };
        let entries = rows
            .into_iter()
            .map(Row::into_entry)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Page {
            entries,
            next_page_token,
        })
    }

    async fn find(&self, effect_key: &str) -> Result<Option<Row>, LedgerError> {
        Ok(on_pool!(self, |pool| sqlx::query_as(concat!(
            "SELECT ",
            columns!(),
            " FROM effects WHERE effect_key = $1"
        ))
        .bind(effect_key)
        .fetch_optional(pool)
        .await?))
    }

    /// Decides with the pure state machine, then writes with a compare-and-set on the
    /// state and attempt that were read, so a concurrent change makes this one fail
    /// instead of overwriting it.
    async fn apply(
        &self,
        effect_key: &str,
        expected: EffectState,
        action: Action,
        receipt: &str,
        detail: &str,
    ) -> Result<Entry, LedgerError> {
        // The edge is checked before the database is asked: a step that could never be
        // taken is refused whatever is stored.
        let transition = |current| {
            state::transition(current, expected, action).map_err(|source| LedgerError::Transition {
                effect_key: effect_key.to_owned(),
                source,
            })
        };
        let step = transition(expected)?;
        // One statement: the guard is its `WHERE`, checked under the row's lock, and the
        // time never goes backwards.
        let updated: Option<Row> = on_pool!(self, |pool| sqlx::query_as(concat!(
            "UPDATE effects \
             SET state = $1, attempt = attempt + $2, receipt = $3, detail = $4, \
                 updated_at_ms = CASE WHEN updated_at_ms > $5 THEN updated_at_ms ELSE $5 END \
             WHERE effect_key = $6 AND state = $7 \
             RETURNING ",
            columns!()
        ))
        .bind(step.next.as_str())
        .bind(i64::from(step.increments_attempt))
        .bind(receipt)
        .bind(detail)
        .bind(now_ms())
        .bind(effect_key)
        .bind(expected.as_str())
        .fetch_optional(pool)
        .await?);
        match updated {
            Some(row) => row.into_entry(),
            // Not there, or not in the expected state: say which, from what is there now.
            None => {
                let found = self.get(effect_key).await?;
                transition(found.state)?;
                Err(LedgerError::Transition {
                    effect_key: effect_key.to_owned(),
                    source: state::TransitionError::NotInExpectedState {
                        expected,
                        found: found.state,
                    },
                })
            }
        }
    }
}

impl Row {
    fn into_entry(self) -> Result<Entry, LedgerError> {
        let corrupt = |reason: String| LedgerError::Corrupt {
            effect_key: self.effect_key.clone(),
            reason,
        };
        let state = EffectState::parse(&self.state)
            .ok_or_else(|| corrupt(format!("unknown state {:?}", self.state)))?;
        let attempt = u32::try_from(self.attempt)
            .map_err(|_| corrupt(format!("attempt {} out of range", self.attempt)))?;
        let created_at = ms_system_time(self.created_at_ms)
            .ok_or_else(|| corrupt(format!("created_at_ms {}", self.created_at_ms)))?;
        let updated_at = ms_system_time(self.updated_at_ms)
            .ok_or_else(|| corrupt(format!("updated_at_ms {}", self.updated_at_ms)))?;
        Ok(Entry {
            invocation_id: self.invocation_id,
            call_id: self.call_id,
            effect_key: self.effect_key,
            attempt,
            tool: self.tool,
            state,
            receipt: self.receipt,
            detail: self.detail,
            created_at,
            updated_at,
        })
    }
}

/// Non-empty, bounded, and free of control characters (which only hide mistakes in
/// logs and keys).
fn validate_id(field: &'static str, value: &str) -> Result<(), LedgerError> {
    if value.is_empty() {
        return Err(LedgerError::invalid(field, "must not be empty"));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(LedgerError::invalid(
            field,
            format!("longer than {MAX_ID_BYTES} bytes"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(LedgerError::invalid(field, "contains control characters"));
    }
    Ok(())
}

/// Page tokens are `u` + the hex cursor; opaque to callers, who must only pass them
/// back. Anything else is INVALID_ARGUMENT.
fn encode_page_token(seq: i64) -> String {
    format!("u{seq:x}")
}

fn decode_page_token(token: &str) -> Result<i64, LedgerError> {
    token
        .strip_prefix('u')
        .filter(|hex| !hex.is_empty() && hex.len() <= 16)
        .and_then(|hex| i64::from_str_radix(hex, 16).ok())
        .filter(|seq| *seq > 0)
        .ok_or_else(|| LedgerError::invalid("page_token", "not a token this server issued"))
}

fn now_ms() -> i64 {
    system_time_ms(SystemTime::now())
}

fn system_time_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn ms_system_time(ms: i64) -> Option<SystemTime> {
    let ms = u64::try_from(ms).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_garbage_is_refused() {
        for seq in [1, 15, 4096, i64::MAX] {
            assert_eq!(decode_page_token(&encode_page_token(seq)).unwrap(), seq);
        }
        for bad in ["", "u", "x10", "u-1", "u0", "uzz", "u10000000000000000"] {
            assert!(
                matches!(
                    decode_page_token(bad),
                    Err(LedgerError::InvalidArgument {
                        field: "page_token",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_unresolved_sql_list_is_the_unresolved_states_and_the_index_predicate() {
        let listed: Vec<&str> = unresolved_states!()
            .trim_matches(['(', ')'])
            .split(", ")
            .map(|name| name.trim_matches('\''))
            .collect();
        let unresolved: Vec<&str> = EffectState::ALL
            .into_iter()
            .filter(|state| state.is_unresolved())
            .map(EffectState::as_str)
            .collect();
        assert_eq!(listed, unresolved);
        // The partial indexes only serve ListUnresolved if their predicate is the same.
        let predicate = concat!("WHERE state IN ", unresolved_states!());
        for schema in [
            include_str!("../migrations/sqlite/0002_reconciliation_required.sql"),
            include_str!("../migrations/postgres/0001_effects.sql"),
        ] {
            assert_eq!(schema.matches(predicate).count(), 2, "{schema}");
        }
    }

    /// The plan the database picks for `listing`, one step a line.
    async fn plan(store: &LedgerStore, listing: Listing<'_>) -> String {
        let invocation_id = listing.invocation_id().unwrap_or_default();
        let steps: Vec<String> = match &store.pool {
            Pool::Sqlite(pool) => {
                // Our own statement behind a fixed prefix; the values are bound.
                let sql = sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {}", listing.sql()));
                let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(sql)
                    .bind(0_i64)
                    .bind(101_i64);
                if listing.invocation_id().is_some() {
                    query = query.bind(invocation_id);
                }
                let rows = query.fetch_all(pool).await.unwrap();
                rows.into_iter().map(|(_, _, _, step)| step).collect()
            }
            Pool::Postgres(pool) => {
                let mut conn = pool.acquire().await.unwrap();
                // An empty table is cheapest to scan; the question is whether an index
                // serves the statement once the table is not empty.
                sqlx::query("SET enable_seqscan = off")
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                let sql = sqlx::AssertSqlSafe(format!("EXPLAIN {}", listing.sql()));
                let mut query = sqlx::query_scalar::<_, String>(sql)
                    .bind(0_i64)
                    .bind(101_i64);
                if listing.invocation_id().is_some() {
                    query = query.bind(invocation_id);
                }
                query.fetch_all(&mut *conn).await.unwrap()
            }
        };
        steps.join("\n")
    }

    /// The orchestrator lists an invocation once per final answer, so that listing must
    /// be an index range in `seq` order, not a scan or a sort, on both backends.
    async fn assert_by_invocation_uses_its_index(store: &LedgerStore) {
        let plan = plan(store, Listing::AllOf("inv")).await;
        assert!(plan.contains("effects_by_invocation"), "{plan}");
        for unwanted in ["Seq Scan", "Sort", "TEMP B-TREE"] {
            assert!(!plan.contains(unwanted), "{plan}");
        }
    }

    #[tokio::test]
    async fn listing_an_invocation_is_served_by_its_index_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            LedgerStore::open_sqlite(&dir.path().join("ledger.sqlite3"), &StoreOptions::default())
                .await
                .unwrap();
        assert_by_invocation_uses_its_index(&store).await;
        store.close().await;
    }

    #[tokio::test]
    async fn listing_an_invocation_is_served_by_its_index_on_postgres() {
        let test = "listing_an_invocation_is_served_by_its_index_on_postgres";
        let Some(server) = agentloop_store::testing::PostgresServer::for_test(test).await else {
            return;
        };
        let database = server.create_database().await.unwrap();
        let store = LedgerStore::connect_postgres(database.url(), &StoreOptions::default())
            .await
            .unwrap();
        assert_by_invocation_uses_its_index(&store).await;
        store.close().await;
    }

    #[test]
    fn ids_are_bounded_and_non_empty() {
        assert!(validate_id("call_id", "c-1").is_ok());
        assert!(validate_id("call_id", &"x".repeat(MAX_ID_BYTES)).is_ok());
        for bad in [
            String::new(),
            "x".repeat(MAX_ID_BYTES + 1),
            "a\nb".to_owned(),
        ] {
            assert!(validate_id("call_id", &bad).is_err(), "{bad:?}");
        }
    }
}
