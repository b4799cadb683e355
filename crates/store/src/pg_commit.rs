//! The appends of a PostgreSQL store: group commit, as the SQLite store does it.
//!
//! One transaction per append costs a turn five statements and as many round trips
//! (BEGIN, a locking SELECT, INSERT, UPDATE, COMMIT) and one WAL flush. Here the appends
//! that are ready at once, from many invocations, go to the server as **one statement**:
//! its data-modifying `WITH` updates every invocation row whose state, version and lease
//! epoch allow the append, inserts the events of exactly those, and returns their IDs.
//! Outside a transaction block one statement is one transaction, committed before the
//! server answers its `Sync` (with `synchronous_commit = on`, flushed): so a group costs
//! one round trip and one flush, and no append is acknowledged before its commit.
//!
//! **Fencing stays in the statement.** The row's checks are the `UPDATE`'s `WHERE`: a
//! concurrent writer of the same invocation holds the row lock until it commits, and
//! PostgreSQL then evaluates the `WHERE` again on the row that writer left, so a stale
//! lease epoch or an old version can never commit, whatever else is in its group. An
//! append the statement refused is told why from the row as it is after the commit
//! (versions and epochs only grow and an end is final, so what refused it then still
//! refuses it); only refusals pay that second round trip.
//!
//! **One append per invocation per group**: the `UPDATE` can change a row once, so a
//! second append to an invocation already in the group waits for the next one, which
//! starts once the groups in flight have committed, so appends keep their queue order.
//!
//! **Failures.** A statement the server rejects (a deadlock between two groups that share
//! invocations, an event that breaks a constraint) wrote nothing; its appends are then
//! written one by one, so only the culprit fails. Any other failure (a lost connection)
//! leaves the group's fate unknown, and every append of it gets the error, as a lone
//! append's would.
//!
//! **Where it runs.** A leader task takes groups from a bounded queue ([`QUEUE_BOUND`],
//! at most [`MAX_GROUP`] appends each) and runs up to [`COMMITTERS`] of them at once, on a
//! thread and a connection pool of its own: its wake-ups do not queue behind the
//! invocations runnable on the caller's runtime, and the store keeps working when it is
//! shared between runtimes (tests do).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgPool};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::codec::{EncodedAppend, StoredState, closed, decode_state, group_failure, state_text};
use crate::{Append, StoreError};

/// Most appends one statement carries: bounds the statement and a group's latency.
const MAX_GROUP: usize = 1_024;
/// Most appends waiting for a committer; senders wait beyond it.
const QUEUE_BOUND: usize = 4_096;
/// Groups in flight at once, each on a connection of its own: while one waits for its
/// flush, the next gathers what arrived meanwhile.
pub(crate) const COMMITTERS: usize = 4;

/// Every append of a group, one array per column; `UNNEST` turns them back into rows.
/// Each event carries the epoch that committed it (the join is one row per event: a group
/// holds at most one append per invocation).
const APPEND_GROUP: &str = "\
WITH batch AS (
    SELECT * FROM UNNEST($1::uuid[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[],
                         $6::text[], $7::text[], $8::bigint[], $9::bigint[])
        AS b (invocation_id, expected_version, lease_epoch, version, totals,
              state, end_record, wait_until, committed_at)
), accepted AS (
    UPDATE invocations AS i
    SET version = b.version, lease_epoch = b.lease_epoch, totals = b.totals,
        state = b.state, end_record = b.end_record, wait_until = b.wait_until,
        updated_at = b.committed_at
    FROM batch AS b
    WHERE i.invocation_id = b.invocation_id
      AND i.state <> 'ended'
      AND i.lease_epoch <= b.lease_epoch
      AND i.version = b.expected_version
    RETURNING i.invocation_id
), written AS (
    INSERT INTO events (invocation_id, seq, committed_at, body, lease_epoch)
    SELECT e.invocation_id, e.seq, e.committed_at, e.body, b.lease_epoch
    FROM UNNEST($10::uuid[], $11::bigint[], $12::bigint[], $13::text[])
        AS e (invocation_id, seq, committed_at, body)
    JOIN batch AS b ON b.invocation_id = e.invocation_id
    WHERE e.invocation_id IN (SELECT invocation_id FROM accepted)
)
SELECT invocation_id::text FROM accepted";

/// How many groups committed, and the largest: whether appends really share statements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PgCommitStats {
    /// Statements that carried appends.
    pub groups: u64,
    /// Appends the groups carried.
    pub appends: u64,
    /// Appends in the largest group.
    pub largest_group: u64,
}

#[derive(Debug, Default)]
struct Counters {
    groups: AtomicU64,
    appends: AtomicU64,
    largest_group: AtomicU64,
}

struct AppendJob {
    append: EncodedAppend,
    reply: oneshot::Sender<Result<(), StoreError>>,
}

enum Job {
    Append(AppendJob),
    /// Start no group until `release` fires (or is dropped); say so on `inside`.
    Hold {
        inside: oneshot::Sender<()>,
        release: oneshot::Receiver<()>,
    },
}

/// The handle every clone of a store shares; the leader stops when the last one is
/// dropped, after committing what is queued.
#[derive(Debug, Clone)]
pub(crate) struct Committer {
    jobs: mpsc::Sender<Job>,
    pool: PgPool,
    counters: Arc<Counters>,
}

impl Committer {
    /// Starts the leader on a thread of its own, with a pool of [`COMMITTERS`]
    /// connections made by `options` when first needed.
    pub(crate) fn start(
        options: PgConnectOptions,
        acquire_timeout: Duration,
    ) -> std::io::Result<Committer> {
        let pool =
            crate::pg_pool_options(COMMITTERS as u32, acquire_timeout).connect_lazy_with(options);
        let (jobs, queue) = mpsc::channel(QUEUE_BOUND);
        let counters = Arc::new(Counters::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let leader = lead(pool.clone(), queue, Arc::clone(&counters));
        std::thread::Builder::new()
            .name("agentloop-pg-commit".into())
            .spawn(move || runtime.block_on(leader))?;
        Ok(Committer {
            jobs,
            pool,
            counters,
        })
    }

    /// Appends once the group holding it is committed.
    pub(crate) async fn append(
        &self,
        invocation_id: uuid::Uuid,
        append: &Append<'_>,
    ) -> Result<(), StoreError> {
        let append = EncodedAppend::new(invocation_id, append)?;
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job::Append(AppendJob { append, reply }))
            .await
            .map_err(|_| closed())?;
        // A dropped reply means the leader stopped before the append was written.
        answer.await.map_err(|_| closed())?
    }

    pub(crate) fn stats(&self) -> PgCommitStats {
        PgCommitStats {
            groups: self.counters.groups.load(Relaxed),
            appends: self.counters.appends.load(Relaxed),
            largest_group: self.counters.largest_group.load(Relaxed),
        }
    }

    /// Stops groups from starting until the hold is released; see [`PgCommitHold`].
    pub(crate) async fn hold(&self) -> Result<PgCommitHold, StoreError> {
        let (inside_tx, inside) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        let hold = Job::Hold {
            inside: inside_tx,
            release: release_rx,
        };
        self.jobs.send(hold).await.map_err(|_| closed())?;
        inside.await.map_err(|_| closed())?;
        Ok(PgCommitHold {
            release,
            jobs: self.jobs.clone(),
        })
    }

    /// Closes the committers' connections; appends after it fail.
    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }
}

/// The committer of a [`crate::PgStore`] held by [`crate::PgStore::hold_commits`]: appends
/// queue up until [`PgCommitHold::release`], then go together (up to the group bound).
#[derive(Debug)]
pub struct PgCommitHold {
    release: oneshot::Sender<()>,
    jobs: mpsc::Sender<Job>,
}

impl PgCommitHold {
    /// Appends queued behind the hold.
    pub fn queued(&self) -> usize {
        self.jobs.max_capacity() - self.jobs.capacity()
    }

    /// Lets groups start again.
    pub fn release(self) {
        // The leader may have stopped already; then there is nothing to release.
        let _ = self.release.send(());
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Job::Append(job) => write!(f, "Append({})", job.append.invocation_id),
            Job::Hold { .. } => f.write_str("Hold"),
        }
    }
}

/// Takes groups off the queue and commits up to [`COMMITTERS`] at once, until every
/// sender is gone; then waits for the groups in flight.
async fn lead(pool: PgPool, mut queue: mpsc::Receiver<Job>, counters: Arc<Counters>) {
    let slots = Arc::new(Semaphore::new(COMMITTERS));
    let mut held = Vec::new();
    loop {
        if !held.is_empty() {
            // A held append goes in the next group, after the one that holds its
            // invocation's earlier append has committed: appends keep their queue order.
            let Ok(all) = slots.acquire_many(COMMITTERS as u32).await else {
                break;
            };
            drop(all);
        }
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            break;
        };
        let Some(group) = next_group(&mut queue, &mut held).await else {
            break;
        };
        let size = u64::try_from(group.len()).unwrap_or(u64::MAX);
        counters.groups.fetch_add(1, Relaxed);
        counters.appends.fetch_add(size, Relaxed);
        counters.largest_group.fetch_max(size, Relaxed);
        let pool = pool.clone();
        tokio::spawn(async move {
            commit(&pool, group).await;
            drop(slot);
        });
    }
    let _ = slots.acquire_many(COMMITTERS as u32).await;
}

/// The next group: the appends held back from the last one first, then what is queued,
/// at most one per invocation (a second waits in `held`). Waits for the first append;
/// `None` once the queue is closed and nothing is held.
async fn next_group(
    queue: &mut mpsc::Receiver<Job>,
    held: &mut Vec<AppendJob>,
) -> Option<Vec<AppendJob>> {
    let mut group = Vec::new();
    let mut ids = HashSet::new();
    let mut later = Vec::new();
    for job in held.drain(..) {
        if ids.insert(job.append.invocation_id) {
            group.push(job);
        } else {
            later.push(job);
        }
    }
    *held = later;
    while group.is_empty() {
        match queue.recv().await? {
            Job::Append(job) => {
                ids.insert(job.append.invocation_id);
                group.push(job);
            }
            Job::Hold { inside, release } => {
                let _ = inside.send(());
                let _ = release.await;
            }
        }
    }
    while group.len() < MAX_GROUP && held.len() < MAX_GROUP {
        match queue.try_recv() {
            Ok(Job::Append(job)) if ids.insert(job.append.invocation_id) => group.push(job),
            Ok(Job::Append(job)) => held.push(job),
            Ok(Job::Hold { inside, release }) => {
                // Held before this group is sent: what queues meanwhile joins the next.
                let _ = inside.send(());
                let _ = release.await;
                break;
            }
            Err(_) => break,
        }
    }
    Some(group)
}

/// Writes a group and answers each of its appends.
async fn commit(pool: &PgPool, group: Vec<AppendJob>) {
    let verdicts = match write(pool, &group).await {
        Ok(accepted) => explain(pool, &group, &accepted).await,
        // The server refused the statement: nothing of it was written.
        Err(sqlx::Error::Database(_)) if group.len() > 1 => {
            let mut verdicts = Vec::with_capacity(group.len());
            for job in &group {
                let alone = std::slice::from_ref(job);
                verdicts.push(match write(pool, alone).await {
                    Ok(accepted) => explain(pool, alone, &accepted).await.remove(0),
                    Err(error) => Err(error.into()),
                });
            }
            verdicts
        }
        Err(error) => group.iter().map(|_| Err(group_failure(&error))).collect(),
    };
    for (job, verdict) in group.into_iter().zip(verdicts) {
        // The caller may have gone away; its append is committed all the same.
        let _ = job.reply.send(verdict);
    }
}

/// Runs the group's statement; the IDs of the appends it accepted.
async fn write(pool: &PgPool, group: &[AppendJob]) -> Result<HashSet<String>, sqlx::Error> {
    let n = group.len();
    let (mut ids, mut expected, mut epochs, mut versions) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut totals, mut states, mut ends, mut waits, mut times) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let rows: usize = group.iter().map(|job| job.append.rows.len()).sum();
    let (mut event_ids, mut seqs, mut event_times, mut bodies) = (
        Vec::with_capacity(rows),
        Vec::with_capacity(rows),
        Vec::with_capacity(rows),
        Vec::with_capacity(rows),
    );
    for AppendJob { append, .. } in group {
        ids.push(append.id_text.as_str());
        // Within i64: the version checks of `EncodedAppend::new` put `new_version`
        // (at least this) there.
        expected.push(i64::try_from(append.expected_version).unwrap_or(i64::MAX));
        epochs.push(append.epoch_column);
        versions.push(append.new_version);
        totals.push(append.totals.as_str());
        states.push(state_text(append.after.state));
        ends.push(append.after.end.as_deref());
        waits.push(append.after.wait_until);
        times.push(append.committed_at);
        for (seq, body) in &append.rows {
            event_ids.push(append.id_text.as_str());
            seqs.push(*seq);
            event_times.push(append.committed_at);
            bodies.push(body.as_str());
        }
    }
    let accepted: Vec<String> = sqlx::query_scalar(APPEND_GROUP)
        .bind(ids)
        .bind(expected)
        .bind(epochs)
        .bind(versions)
        .bind(totals)
        .bind(states)
        .bind(ends)
        .bind(waits)
        .bind(times)
        .bind(event_ids)
        .bind(seqs)
        .bind(event_times)
        .bind(bodies)
        .fetch_all(pool)
        .await?;
    Ok(accepted.into_iter().collect())
}

/// One verdict per append: `Ok` for the accepted ones, and for the others the check that
/// refuses them, read from their rows as they are now.
async fn explain(
    pool: &PgPool,
    group: &[AppendJob],
    accepted: &HashSet<String>,
) -> Vec<Result<(), StoreError>> {
    let refused: Vec<&str> = group
        .iter()
        .map(|job| job.append.id_text.as_str())
        .filter(|id| !accepted.contains(*id))
        .collect();
    if refused.is_empty() {
        return group.iter().map(|_| Ok(())).collect();
    }
    let rows = stored_states(pool, &refused).await;
    group
        .iter()
        .map(|AppendJob { append, .. }| {
            if accepted.contains(&append.id_text) {
                return Ok(());
            }
            let rows = rows.as_ref().map_err(|error| group_failure(error))?;
            let id = append.invocation_id;
            let Some(stored) = rows.get(&append.id_text) else {
                return Err(StoreError::NotFound(id));
            };
            let (state, version, lease_epoch) = decode_state(stored, id)?;
            append.check(state, version, lease_epoch)?;
            Err(StoreError::Corrupt(format!(
                "invocation {id}: the append was refused, yet its row passes every check"
            )))
        })
        .collect()
}

/// The rows of `ids` as they are now, by ID.
async fn stored_states(
    pool: &PgPool,
    ids: &[&str],
) -> Result<HashMap<String, StoredState>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT invocation_id::text AS invocation_id, state, version, lease_epoch \
         FROM invocations WHERE invocation_id = ANY($1::uuid[])",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            let stored = (
                row.try_get("state")?,
                row.try_get("version")?,
                row.try_get("lease_epoch")?,
            );
            Ok((row.try_get("invocation_id")?, stored))
        })
        .collect()
}
