//! The one writer of a SQLite store: group commit.
//!
//! SQLite has a single write lock and, with `synchronous=FULL`, one fsync of the WAL per
//! committed transaction. One transaction per append would cap a store at one turn per
//! fsync (a few milliseconds on ordinary disks), however many invocations run. So every
//! write of a [`crate::SqliteStore`] goes through one task that owns the only writing
//! connection: it takes whatever jobs have queued up (at most [`MAX_GROUP`]), runs them
//! in one `BEGIN IMMEDIATE` transaction and commits it with one fsync. Nothing is
//! acknowledged before that commit returns, so a caller that got `Ok` has a durable write.
//!
//! Each job still gets its own result:
//! - appends are checked one by one, in queue order, against the invocation rows read
//!   inside the transaction and updated in memory as the group goes, so a version
//!   conflict, a stale epoch or an ended invocation fails that append alone (a second
//!   append to the same invocation in the same group sees the first one). The accepted
//!   appends are then written by multi-row `INSERT` and `UPDATE` statements of up to
//!   1,024 rows, so a group of a thousand turns takes a handful of statements, not
//!   thousands (each is a round trip to SQLite's connection thread).
//!   If those statements fail anyway (a row changed behind the store's back), the group
//!   is rolled back and its appends replayed one by one, each under a savepoint, so only
//!   the culprit fails;
//! - creates are checked the same way (an idempotency key stored already, or taken by an
//!   earlier create of the group, answers with that invocation) and written by multi-row
//!   statements too, under a savepoint: should those fail, they are replayed one by one;
//! - other writes (`claim`, `request_cancel`) are sessions: a function run on the
//!   connection under its own savepoint, rolled back alone when it returns an error.
//!
//! Only a failed `COMMIT` (I/O error, full disk) fails the whole group. Routing every
//! write through this task also means no writer ever waits in SQLite's busy handler,
//! which sleeps and could starve behind a busy group writer.
//!
//! The queue is bounded ([`QUEUE_BOUND`]): when the disk cannot keep up, callers wait to
//! enqueue instead of piling up memory.
//!
//! The writer runs on a thread of its own (a single-threaded runtime), not as a task of
//! the caller's runtime. A group takes several round trips to SQLite's connection thread,
//! and each wakes the writer from outside the runtime; queued behind a thousand runnable
//! invocations, every wake-up waited its turn, and the store's throughput went with the
//! load on the runtime rather than with the disk.
//!
//! WAL checkpoints (copying the log into the database file) mostly do not run on the
//! writer's connection, where SQLite would run them inside a commit and stall every
//! writer: the writer's automatic checkpoint is off, and after every [`CHECKPOINT_EVERY`]
//! writes it asks a checkpointer task to run a `PASSIVE` checkpoint on a reading
//! connection, which proceeds alongside the writer's next groups. That one can never copy
//! the frames committed while it ran, and SQLite only restarts the log from its start once
//! every frame is copied; so after each, the writer copies that short tail itself between
//! two groups, and the log stays a few MiB instead of growing for ever.

use std::collections::HashMap;
use std::collections::hash_map::Entry::{Occupied, Vacant};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::{AssertSqlSafe, Connection, Row};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use uuid::Uuid;

use crate::codec::{
    EncodedAppend, StoredState, closed, decode_state, fresh_record, group_failure,
    idempotent_answer, scoped_key, state_text, time_to_i64, to_json,
};
use crate::sqlite::{SELECT_INVOCATION, decode_invocation};
use crate::{Append, Created, InvocationRecord, InvocationState, NewInvocation, StoreError};

/// Most jobs one transaction carries. Bounds the latency a group adds to its jobs and
/// the memory it holds.
pub(crate) const MAX_GROUP: usize = 1_024;
/// The longest a group waits for more jobs (see [`gather`]).
const GATHER_MAX: Duration = Duration::from_millis(2);
/// Most jobs waiting for the writer; senders wait beyond it.
pub(crate) const QUEUE_BOUND: usize = 4_096;
/// Writes between two checkpoint requests: a few MiB of log, like SQLite's default of
/// 1,000 pages.
pub(crate) const CHECKPOINT_EVERY: u64 = 1_024;

/// What the writer has done since the store was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteStats {
    /// Write transactions committed. Under `synchronous=FULL` each one is one fsync of
    /// the WAL.
    pub commits: u64,
    /// Checkpoints that found the log holding copied frames (the background ones and
    /// the writer's tails): about two fsyncs each (the log, then the database file).
    pub checkpoints: u64,
    /// Appends acknowledged.
    pub appends: u64,
    /// Creates acknowledged (new invocations and idempotent answers).
    pub creates: u64,
    /// Other writes acknowledged (`claim`, `request_cancel`).
    pub sessions: u64,
    /// The most jobs one transaction carried.
    pub largest_group: u64,
}

#[derive(Debug, Default)]
struct Counters {
    commits: AtomicU64,
    checkpoints: AtomicU64,
    appends: AtomicU64,
    creates: AtomicU64,
    sessions: AtomicU64,
    largest_group: AtomicU64,
}

/// A session's work: runs on the writer's connection inside the group transaction.
pub(crate) type SessionFn<T> = Box<
    dyn for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, StoreError>> + Send,
>;

/// Hands a finished session's result to its caller once the group's fate is known.
type Deliver = Box<dyn FnOnce(Result<(), &sqlx::Error>) + Send>;

/// A type-erased session: runs, then says whether it succeeded and how to deliver.
trait Session: Send {
    fn run<'c>(self: Box<Self>, conn: &'c mut SqliteConnection) -> BoxFuture<'c, (bool, Deliver)>;
}

struct Typed<T> {
    work: SessionFn<T>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T: Send + 'static> Session for Typed<T> {
    fn run<'c>(self: Box<Self>, conn: &'c mut SqliteConnection) -> BoxFuture<'c, (bool, Deliver)> {
        let Typed { work, reply } = *self;
        Box::pin(async move {
            let result = work(conn).await;
            let succeeded = result.is_ok();
            let deliver: Deliver = Box::new(move |commit| {
                let answer = match commit {
                    Ok(()) => result,
                    Err(error) => Err(group_failure(error)),
                };
                // The caller may have gone away; its write is committed all the same.
                let _ = reply.send(answer);
            });
            (succeeded, deliver)
        })
    }
}

/// One append and where its answer goes.
pub(crate) struct AppendJob {
    append: EncodedAppend,
    reply: oneshot::Sender<Result<(), StoreError>>,
}

enum Job {
    Append(AppendJob),
    Create(CreateJob),
    Session(Box<dyn Session>),
    /// Finish what is queued, then stop.
    Close,
}

/// The handle every clone of a store shares; the task stops when the last one is dropped.
#[derive(Debug)]
pub(crate) struct Writer {
    jobs: mpsc::Sender<Job>,
    counters: Arc<Counters>,
    /// Resolves when the writer's thread has closed the connection.
    stopped: Mutex<Option<oneshot::Receiver<()>>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Job::Append(_) => "Append",
            Job::Create(_) => "Create",
            Job::Session(_) => "Session",
            Job::Close => "Close",
        })
    }
}

impl Writer {
    /// Starts the writer's thread on `conn`, which must not be used by anything else and
    /// must have its automatic checkpoint off; checkpoints run on a connection of `pool`.
    ///
    /// # Errors
    ///
    /// The thread or its runtime could not be created.
    pub(crate) fn start(conn: SqliteConnection, pool: SqlitePool) -> std::io::Result<Writer> {
        let (jobs, queue) = mpsc::channel(QUEUE_BOUND);
        let counters = Arc::new(Counters::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = oneshot::channel();
        let shared = Arc::clone(&counters);
        // Ends when every handle is dropped or on `close` (see `run`).
        std::thread::Builder::new()
            .name("event-store-writer".into())
            .spawn(move || {
                runtime.block_on(run(conn, queue, pool, shared));
                let _ = stop.send(());
            })?;
        Ok(Writer {
            jobs,
            counters,
            stopped: Mutex::new(Some(stopped)),
        })
    }

    pub(crate) fn stats(&self) -> SqliteStats {
        SqliteStats {
            commits: self.counters.commits.load(Relaxed),
            checkpoints: self.counters.checkpoints.load(Relaxed),
            appends: self.counters.appends.load(Relaxed),
            creates: self.counters.creates.load(Relaxed),
            sessions: self.counters.sessions.load(Relaxed),
            largest_group: self.counters.largest_group.load(Relaxed),
        }
    }

    /// Appends once the group holding it is committed.
    pub(crate) async fn append(
        &self,
        invocation_id: Uuid,
        append: &Append<'_>,
    ) -> Result<(), StoreError> {
        let append = EncodedAppend::new(invocation_id, append)?;
        let (reply, answer) = oneshot::channel();
        let job = AppendJob { append, reply };
        self.submit(Job::Append(job), answer).await
    }

    /// Creates an invocation once the group holding it is committed.
    pub(crate) async fn create(&self, new: NewInvocation) -> Result<Created, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = CreateJob {
            id_text: new.invocation_id.hyphenated().to_string(),
            key: new
                .idempotency_key
                .as_deref()
                .map(|key| scoped_key(&new.tenant, key)),
            created_at: time_to_i64(new.created_at),
            totals: to_json(&crate::Totals::default())?,
            new,
            reply,
        };
        self.submit(Job::Create(job), answer).await
    }

    /// Runs `work` in the next group; its result is returned once the group is committed
    /// (an error rolls back `work`'s changes alone).
    pub(crate) async fn session<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, StoreError>>
            + Send
            + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let session = Typed {
            work: Box::new(work),
            reply,
        };
        self.submit(Job::Session(Box::new(session)), answer).await
    }

    async fn submit<T>(
        &self,
        job: Job,
        answer: oneshot::Receiver<Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.jobs.send(job).await.map_err(|_| closed())?;
        // A dropped reply means the writer stopped before running the job.
        answer.await.map_err(|_| closed())?
    }

    /// Holds the writer inside a group until the returned [`WriterHold`] is released, so
    /// that writes queue up behind it and are then taken together, as under load.
    pub(crate) async fn hold(&self) -> Result<WriterHold, StoreError> {
        let (entered, inside) = oneshot::channel::<()>();
        let (release, released) = oneshot::channel::<()>();
        let (done_tx, done) = oneshot::channel();
        let jobs = self.jobs.clone();
        let session = Typed {
            work: Box::new(move |_conn: &mut SqliteConnection| {
                Box::pin(async move {
                    let _ = entered.send(());
                    // A dropped hold releases the writer too.
                    let _ = released.await;
                    Ok(())
                }) as BoxFuture<'_, Result<(), StoreError>>
            }),
            reply: done_tx,
        };
        self.jobs
            .send(Job::Session(Box::new(session)))
            .await
            .map_err(|_| closed())?;
        inside.await.map_err(|_| closed())?;
        Ok(WriterHold {
            release,
            done,
            jobs,
        })
    }

    /// Commits what is queued, stops the writer and closes its connection.
    pub(crate) async fn close(&self) {
        // Fails only when the writer has already stopped.
        let _ = self.jobs.send(Job::Close).await;
        let stopped = self
            .stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(stopped) = stopped
            && stopped.await.is_err()
        {
            tracing::warn!("the event store's writer thread failed");
        }
    }
}

/// A writer held inside a group by [`crate::SqliteStore::hold_writer`].
#[derive(Debug)]
pub struct WriterHold {
    release: oneshot::Sender<()>,
    done: oneshot::Receiver<Result<(), StoreError>>,
    jobs: mpsc::Sender<Job>,
}

impl WriterHold {
    /// Writes queued behind the held group.
    pub fn queued(&self) -> usize {
        self.jobs.max_capacity() - self.jobs.capacity()
    }

    /// Lets the held group commit, and waits until it has.
    ///
    /// # Errors
    ///
    /// The writer stopped.
    pub async fn release(self) -> Result<(), StoreError> {
        let _ = self.release.send(());
        self.done.await.map_err(|_| closed())?
    }
}

/// The writer loop: one group per turn of the loop, until closed or orphaned.
async fn run(
    mut conn: SqliteConnection,
    mut queue: mpsc::Receiver<Job>,
    pool: SqlitePool,
    counters: Arc<Counters>,
) {
    // One pending request at most: a checkpoint asked for while one runs covers both.
    let (checkpoint, requests) = mpsc::channel(1);
    // Set by the checkpointer after each checkpoint: the writer copies the tail.
    let tail_due = Arc::new(AtomicBool::new(false));
    // Ends when `checkpoint` is dropped below; awaited before the connection closes.
    let checkpointer = tokio::spawn(checkpoints(
        pool,
        requests,
        Arc::clone(&tail_due),
        Arc::clone(&counters),
    ));
    let mut since_checkpoint = 0;
    let mut jobs = Vec::with_capacity(MAX_GROUP);
    let (mut last_group, mut last_commit) = (0, Duration::ZERO);
    loop {
        jobs.clear();
        // Waits for the first job, then takes every other one already queued: a group is
        // whatever arrived while the previous one was committing.
        if queue.recv_many(&mut jobs, MAX_GROUP).await == 0 {
            break;
        }
        gather(&mut queue, &mut jobs, last_group, last_commit).await;
        let started = Instant::now();
        let mut group = Group::default();
        for job in jobs.drain(..) {
            match job {
                Job::Append(append) => group.appends.push(append),
                Job::Create(create) => group.creates.push(create),
                Job::Session(session) => group.sessions.push(session),
                // Stop taking jobs; those already queued are still committed.
                Job::Close => queue.close(),
            }
        }
        let jobs_in_group = group.appends.len() + group.creates.len() + group.sessions.len();
        if jobs_in_group == 0 {
            continue;
        }
        let size = u64::try_from(jobs_in_group).unwrap_or(u64::MAX);
        counters.largest_group.fetch_max(size, Relaxed);
        commit_group(&mut conn, group, &counters).await;
        (last_group, last_commit) = (jobs_in_group, started.elapsed());
        since_checkpoint += size;
        if since_checkpoint >= CHECKPOINT_EVERY {
            since_checkpoint = 0;
            // Full: a request is pending already.
            let _ = checkpoint.try_send(());
        }
        if tail_due.swap(false, Relaxed) {
            let tail = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
                .fetch_one(&mut conn)
                .await;
            count_checkpoint(tail, &counters);
        }
    }
    drop(checkpoint);
    if let Err(error) = checkpointer.await {
        tracing::warn!(%error, "the event store's checkpointer task failed");
    }
    if let Err(error) = conn.close().await {
        tracing::warn!(%error, "closing the event store's writer connection failed");
    }
}

/// Under a steady load, the jobs that would have joined a group arrive just after it was
/// taken, and a group of a few costs one fsync like a group of hundreds (on a virtual disk
/// an fsync also costs hundreds of microseconds of CPU). So a group less than half the size
/// of the last one waits for more, at most half the last commit's duration and at most
/// [`GATHER_MAX`]. A lone invocation (a last group of one) never waits.
async fn gather(
    queue: &mut mpsc::Receiver<Job>,
    jobs: &mut Vec<Job>,
    last_group: usize,
    last_commit: Duration,
) {
    let until = Instant::now() + (last_commit / 2).min(GATHER_MAX);
    while jobs.len() * 2 < last_group {
        let room = MAX_GROUP - jobs.len();
        match tokio::time::timeout_at(until, queue.recv_many(jobs, room)).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Runs a `PASSIVE` checkpoint per request: it copies what the log holds into the database
/// without waiting for (or blocking) the writer or readers.
async fn checkpoints(
    pool: SqlitePool,
    mut requests: mpsc::Receiver<()>,
    tail_due: Arc<AtomicBool>,
    counters: Arc<Counters>,
) {
    while requests.recv().await.is_some() {
        let done = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&pool)
            .await;
        count_checkpoint(done, &counters);
        tail_due.store(true, Relaxed);
    }
}

/// Counts a checkpoint by its answer: (busy, frames in the log, frames copied so far).
fn count_checkpoint(done: Result<(i64, i64, i64), sqlx::Error>, counters: &Counters) {
    match done {
        Ok((_, _, copied)) if copied > 0 => {
            counters.checkpoints.fetch_add(1, Relaxed);
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "a WAL checkpoint failed"),
    }
}

/// The jobs of one group, by kind.
#[derive(Default)]
struct Group {
    appends: Vec<AppendJob>,
    creates: Vec<CreateJob>,
    sessions: Vec<Box<dyn Session>>,
}

async fn commit_group(conn: &mut SqliteConnection, group: Group, counters: &Counters) {
    let Group {
        appends,
        creates,
        sessions,
    } = group;
    let mut delivered = Vec::with_capacity(sessions.len());
    let mut verdicts = Vec::with_capacity(appends.len());
    let mut created = Vec::with_capacity(creates.len());
    let outcome = async {
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        // Appends first, without a savepoint: under one, SQLite copies every page it
        // changes to a sub-journal. Should the batch fail, nothing else is in the
        // transaction yet, so it is rolled back whole and the appends replayed one by one.
        let wrote_appends = match apply(&mut tx, &appends).await {
            Ok(checked) => {
                let wrote = checked.iter().any(Result::is_ok);
                verdicts.extend(appends.into_iter().zip(checked));
                wrote
            }
            Err(error) => {
                tx.rollback().await?;
                tx = conn.begin_with("BEGIN IMMEDIATE").await?;
                one_by_one(&mut tx, appends, error, &mut verdicts).await?
            }
        };
        // All of the group is concurrent, so any order is a valid one.
        let wrote_creates = create_all(&mut tx, creates, &mut created).await?;
        for session in sessions {
            let mut savepoint = tx.begin().await?;
            let (succeeded, deliver) = session.run(&mut savepoint).await;
            if succeeded {
                savepoint.commit().await?;
            } else {
                savepoint.rollback().await?;
            }
            delivered.push((succeeded, deliver));
        }
        let wrote_sessions = delivered.iter().any(|(succeeded, _)| *succeeded);
        tx.commit().await?;
        Ok::<bool, sqlx::Error>(wrote_sessions || wrote_appends || wrote_creates)
    }
    .await;
    match &outcome {
        Ok(wrote) => {
            if *wrote {
                counters.commits.fetch_add(1, Relaxed);
            }
            let sessions_ok = delivered.iter().filter(|(ok, _)| *ok).count();
            let appends_ok = verdicts.iter().filter(|(_, v)| v.is_ok()).count();
            let creates_ok = created.iter().filter(|(_, v)| v.is_ok()).count();
            counters
                .creates
                .fetch_add(u64::try_from(creates_ok).unwrap_or(0), Relaxed);
            counters
                .sessions
                .fetch_add(u64::try_from(sessions_ok).unwrap_or(0), Relaxed);
            counters
                .appends
                .fetch_add(u64::try_from(appends_ok).unwrap_or(0), Relaxed);
        }
        Err(error) => tracing::warn!(%error, "a group commit of the event store failed"),
    }
    let commit = outcome.as_ref().map(|_| ());
    for (_, deliver) in delivered {
        deliver(commit);
    }
    for (job, verdict) in created {
        let answer = match commit {
            Ok(()) => verdict,
            Err(error) => Err(group_failure(error)),
        };
        let _ = job.reply.send(answer);
    }
    for (job, verdict) in verdicts {
        let answer = match commit {
            Ok(()) => verdict,
            Err(error) => Err(group_failure(error)),
        };
        let _ = job.reply.send(answer);
    }
}

/// A create waiting for its group.
pub(crate) struct CreateJob {
    new: NewInvocation,
    id_text: String,
    /// The idempotency key as stored ([`scoped_key`]).
    key: Option<String>,
    created_at: i64,
    totals: String,
    reply: oneshot::Sender<Result<Created, StoreError>>,
}

/// A create's answer, waiting for the group's commit.
type Answer = (CreateJob, Result<Created, StoreError>);

/// Runs the group's creates under a savepoint, all at once; should that fail, rolls it
/// back and replays them one by one, so only the culprit fails. Fills `answers` and says
/// whether anything was written.
async fn create_all(
    conn: &mut SqliteConnection,
    creates: Vec<CreateJob>,
    answers: &mut Vec<Answer>,
) -> Result<bool, sqlx::Error> {
    if creates.is_empty() {
        return Ok(false);
    }
    let mut savepoint = conn.begin().await?;
    match create_batch(&mut savepoint, &creates).await {
        Ok(checked) => {
            savepoint.commit().await?;
            let wrote = checked.iter().any(CreateJob::wrote);
            answers.extend(creates.into_iter().zip(checked));
            Ok(wrote)
        }
        Err(error) => {
            savepoint.rollback().await?;
            one_by_one(conn, creates, error, answers).await
        }
    }
}

/// Answers each create in order, from the stored keys and those taken earlier in the
/// batch, and writes the new ones with multi-row `INSERT`s. `Err` only when a statement
/// fails.
async fn create_batch(
    conn: &mut SqliteConnection,
    creates: &[CreateJob],
) -> Result<Vec<Result<Created, StoreError>>, sqlx::Error> {
    let mut keys: Vec<&str> = creates.iter().filter_map(|c| c.key.as_deref()).collect();
    keys.sort_unstable();
    keys.dedup();
    // A stored row that does not decode fails the creates with its key, not the batch.
    let mut stored: HashMap<String, Result<InvocationRecord, String>> = HashMap::new();
    for chunk in chunks(&keys) {
        let sql = format!(
            "{SELECT_INVOCATION} WHERE idempotency_key IN ({})",
            placeholders(chunk.len(), 1)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for key in chunk {
            query = query.bind(*key);
        }
        for row in query.fetch_all(&mut *conn).await? {
            let key: String = row.try_get("idempotency_key")?;
            stored.insert(key, decode_invocation(&row).map_err(|e| e.to_string()));
        }
    }
    let mut taken: HashMap<&str, InvocationRecord> = HashMap::new();
    let mut answers = Vec::with_capacity(creates.len());
    let mut new = Vec::with_capacity(creates.len());
    for create in creates {
        if let Some(key) = create.key.as_deref() {
            if let Some(existing) = stored.get(key) {
                answers.push(match existing {
                    Ok(record) => idempotent_answer(&create.new, record.clone()),
                    Err(corrupt) => Err(StoreError::Corrupt(corrupt.clone())),
                });
                continue;
            }
            if let Some(earlier) = taken.get(key) {
                answers.push(idempotent_answer(&create.new, earlier.clone()));
                continue;
            }
            taken.insert(key, fresh_record(create.new.clone()));
        }
        new.push(create);
        answers.push(Ok(Created::New(fresh_record(create.new.clone()))));
    }
    for chunk in chunks(&new) {
        let sql = format!(
            "INSERT INTO invocations (invocation_id, tenant, idempotency_key, state, version, \
             lease_epoch, totals, end_record, created_at, updated_at) VALUES {}",
            placeholders(chunk.len(), 10)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for create in chunk {
            query = query
                .bind(create.id_text.as_str())
                .bind(create.new.tenant.as_str())
                .bind(create.key.as_deref())
                .bind(state_text(InvocationState::Running))
                .bind(0_i64)
                .bind(0_i64)
                .bind(create.totals.as_str())
                .bind(None::<&str>)
                .bind(create.created_at)
                .bind(create.created_at);
        }
        query.execute(&mut *conn).await?;
        let sql = format!(
            "INSERT INTO invocation_specs (invocation_id, request_digest, spec) VALUES {}",
            placeholders(chunk.len(), 3)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for create in chunk {
            query = query
                .bind(create.id_text.as_str())
                .bind(create.new.request_digest.as_str())
                .bind(create.new.spec.as_str());
        }
        query.execute(&mut *conn).await?;
    }
    Ok(answers)
}

/// Jobs one statement batch writes together, replayed one by one when the batch fails.
trait Batched: Sized {
    /// What a job gets when it succeeds.
    type Done;
    /// Checks and writes `jobs` together: one verdict per job, in order; `Err` only when
    /// a statement fails.
    fn batch<'c>(conn: &'c mut SqliteConnection, jobs: &'c [Self]) -> BatchFuture<'c, Self::Done>;
    /// Whether a verdict wrote something.
    fn wrote(verdict: &Result<Self::Done, StoreError>) -> bool;
}

type BatchFuture<'c, T> = BoxFuture<'c, Result<Vec<Result<T, StoreError>>, sqlx::Error>>;

impl Batched for AppendJob {
    type Done = ();
    fn batch<'c>(conn: &'c mut SqliteConnection, jobs: &'c [Self]) -> BatchFuture<'c, ()> {
        Box::pin(apply(conn, jobs))
    }
    fn wrote(verdict: &Result<(), StoreError>) -> bool {
        verdict.is_ok()
    }
}

impl Batched for CreateJob {
    type Done = Created;
    fn batch<'c>(conn: &'c mut SqliteConnection, jobs: &'c [Self]) -> BatchFuture<'c, Created> {
        Box::pin(create_batch(conn, jobs))
    }
    fn wrote(verdict: &Result<Created, StoreError>) -> bool {
        matches!(verdict, Ok(Created::New(_)))
    }
}

/// Replays jobs whose batch failed with `error`, each under its own savepoint, so only
/// the culprit fails. Fills `verdicts` and says whether anything was written.
async fn one_by_one<J: Batched>(
    conn: &mut SqliteConnection,
    jobs: Vec<J>,
    error: sqlx::Error,
    verdicts: &mut Vec<(J, Result<J::Done, StoreError>)>,
) -> Result<bool, sqlx::Error> {
    if jobs.len() == 1 {
        // The batch was this job alone: its error is the verdict.
        verdicts.extend(jobs.into_iter().zip([Err(error.into())]));
        return Ok(false);
    }
    tracing::warn!(%error, jobs = jobs.len(), "a batch of writes failed; replaying them one by one");
    let mut wrote = false;
    for job in jobs {
        let mut savepoint = conn.begin().await?;
        match J::batch(&mut savepoint, std::slice::from_ref(&job)).await {
            Ok(mut checked) => {
                savepoint.commit().await?;
                let verdict = checked
                    .pop()
                    .unwrap_or(Err(StoreError::Corrupt("a write got no verdict".into())));
                wrote |= J::wrote(&verdict);
                verdicts.push((job, verdict));
            }
            Err(error) => {
                savepoint.rollback().await?;
                verdicts.push((job, Err(error.into())));
            }
        }
    }
    Ok(wrote)
}

/// What the group knows of one invocation: as read, then as its accepted appends left it.
struct Current {
    state: InvocationState,
    version: u64,
    lease_epoch: u64,
    /// Index into the `UPDATE`'s rows once an append of the group was accepted.
    update: Option<usize>,
}

/// One row of the `UPDATE`: id, version, lease epoch, totals, state, end record, wait
/// bound, time; and whether the state or the end change (then they are set).
type Update<'a> = (
    &'a str,
    i64,
    i64,
    &'a str,
    &'static str,
    Option<&'a str>,
    Option<i64>,
    i64,
    bool,
);

/// Checks each append against the stored rows (read under the write lock) and the
/// appends before it, then writes the accepted ones with one `INSERT` and one `UPDATE`.
/// Returns one verdict per append; `Err` only when a statement fails.
async fn apply(
    conn: &mut SqliteConnection,
    appends: &[AppendJob],
) -> Result<Vec<Result<(), StoreError>>, sqlx::Error> {
    if appends.is_empty() {
        return Ok(Vec::new());
    }
    let mut ids: Vec<&str> = appends.iter().map(|a| a.append.id_text.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut stored: HashMap<String, StoredState> = HashMap::with_capacity(ids.len());
    for chunk in chunks(&ids) {
        let sql = format!(
            "SELECT invocation_id, state, version, lease_epoch FROM invocations \
             WHERE invocation_id IN ({})",
            placeholders(chunk.len(), 1)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for id in chunk {
            query = query.bind(*id);
        }
        for row in query.fetch_all(&mut *conn).await? {
            stored.insert(
                row.try_get("invocation_id")?,
                (
                    row.try_get("state")?,
                    row.try_get("version")?,
                    row.try_get("lease_epoch")?,
                ),
            );
        }
    }
    let mut current: HashMap<&str, Current> = HashMap::with_capacity(stored.len());

    let mut verdicts = Vec::with_capacity(appends.len());
    let mut events: Vec<(&str, i64, i64, &str)> = Vec::new();
    let mut updates: Vec<Update<'_>> = Vec::new();
    for AppendJob { append, .. } in appends {
        let now = match current.entry(append.id_text.as_str()) {
            Occupied(entry) => Ok(entry.into_mut()),
            Vacant(entry) => match stored.get(&append.id_text) {
                None => Err(StoreError::NotFound(append.invocation_id)),
                Some(row) => decode(row, append.invocation_id).map(|now| entry.insert(now)),
            },
        };
        let verdict = now.and_then(|now| {
            append.check(now.state, now.version, now.lease_epoch)?;
            accept(now, append, &mut events, &mut updates);
            Ok(())
        });
        verdicts.push(verdict);
    }
    if events.is_empty() {
        return Ok(verdicts);
    }
    for chunk in chunks(&events) {
        let sql = format!(
            "INSERT INTO events (invocation_id, seq, committed_at, body) VALUES {}",
            placeholders(chunk.len(), 4)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (id, seq, committed_at, body) in chunk {
            query = query.bind(*id).bind(*seq).bind(*committed_at).bind(*body);
        }
        query.execute(&mut *conn).await?;
    }
    // Setting `state` rewrites the entries of the indexes over it, so only the appends
    // that change it (an end, a wait, a resume) set it.
    let (changing, going_on): (Vec<&Update<'_>>, Vec<_>) = updates.iter().partition(|u| u.8);
    for chunk in chunks(&going_on) {
        let sql = format!(
            "UPDATE invocations SET version = u.column2, lease_epoch = u.column3, \
             totals = u.column4, updated_at = u.column5 \
             FROM (VALUES {}) AS u WHERE invocations.invocation_id = u.column1",
            placeholders(chunk.len(), 5)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (id, version, epoch, totals, _, _, _, updated_at, _) in chunk.iter().copied().copied() {
            query = query
                .bind(id)
                .bind(version)
                .bind(epoch)
                .bind(totals)
                .bind(updated_at);
        }
        query.execute(&mut *conn).await?;
    }
    for chunk in chunks(&changing) {
        let sql = format!(
            "UPDATE invocations SET version = u.column2, lease_epoch = u.column3, \
             totals = u.column4, state = u.column5, end_record = u.column6, \
             wait_until = u.column7, updated_at = u.column8 \
             FROM (VALUES {}) AS u WHERE invocations.invocation_id = u.column1",
            placeholders(chunk.len(), 8)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (id, version, epoch, totals, state, end, wait_until, updated_at, _) in
            chunk.iter().copied().copied()
        {
            query = query
                .bind(id)
                .bind(version)
                .bind(epoch)
                .bind(totals)
                .bind(state)
                .bind(end)
                .bind(wait_until)
                .bind(updated_at);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(verdicts)
}

/// Applies an accepted append to the group's view and queues its rows.
fn accept<'a>(
    now: &mut Current,
    append: &'a EncodedAppend,
    events: &mut Vec<(&'a str, i64, i64, &'a str)>,
    updates: &mut Vec<Update<'a>>,
) {
    now.version = append.expected_version + append.rows.len() as u64;
    now.lease_epoch = append.lease_epoch;
    let was = now.state;
    now.state = append.after.state;
    let id = append.id_text.as_str();
    events.extend(
        append
            .rows
            .iter()
            .map(|(seq, body)| (id, *seq, append.committed_at, body.as_str())),
    );
    let update = (
        id,
        append.new_version,
        append.epoch_column,
        append.totals.as_str(),
        state_text(now.state),
        append.after.end.as_deref(),
        append.after.wait_until,
        append.committed_at,
        was != now.state || now.state != InvocationState::Running,
    );
    // Two appends to one invocation in a group: the row ends as the last one left it
    // (and sets the state if either changed it).
    match now.update.and_then(|index| updates.get_mut(index)) {
        Some(slot) => {
            let changes = slot.8 || update.8;
            *slot = update;
            slot.8 = changes;
        }
        None => {
            now.update = Some(updates.len());
            updates.push(update);
        }
    }
}

fn decode(stored: &StoredState, invocation_id: Uuid) -> Result<Current, StoreError> {
    let (state, version, lease_epoch) = decode_state(stored, invocation_id)?;
    Ok(Current {
        state,
        version,
        lease_epoch,
        update: None,
    })
}

/// Rows per statement, at most. Chunks are powers of two, so a group's statements come
/// in a few shapes that stay in the connection's statement cache (SQLite statements are
/// prepared once per shape, not per group). A prepared statement's program grows with
/// its rows, and the cache keeps every shape of every statement: the shapes up to 128
/// rows hold 255 rows' worth, against 2,047 for shapes up to 1,024 (1.9 MiB at
/// `agentloop bench`'s peak), for a few more statements per group of hundreds of turns.
const MAX_ROWS_PER_STATEMENT: usize = 128;

/// `items` in chunks of 128, 64, 32, ... 1: few statements per group, and few statement
/// shapes for the statement cache.
fn chunks<T>(mut items: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        if items.is_empty() {
            return None;
        }
        let size = MAX_ROWS_PER_STATEMENT.min(1 << items.len().ilog2());
        let (chunk, rest) = items.split_at(size);
        items = rest;
        Some(chunk)
    })
}

/// `(?, ?), (?, ?)` for two rows of two columns; `?, ?` for one column.
fn placeholders(rows: usize, columns: usize) -> String {
    let row = vec!["?"; columns].join(", ");
    if columns == 1 {
        return vec![row; rows].join(", ");
    }
    vec![format!("({row})"); rows].join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_powers_of_two_up_to_the_bound() {
        let items: Vec<usize> = (0..2_251).collect();
        let sizes: Vec<usize> = chunks(&items).map(<[usize]>::len).collect();
        assert_eq!(sizes, [vec![128; 17], vec![64, 8, 2, 1]].concat());
        let rejoined: Vec<usize> = chunks(&items).flatten().copied().collect();
        assert_eq!(rejoined, items);
        assert_eq!(chunks::<u8>(&[]).count(), 0);
        assert_eq!(placeholders(2, 2), "(?, ?), (?, ?)");
        assert_eq!(placeholders(3, 1), "?, ?, ?");
    }

    /// `n` jobs; `Close` is the one kind that needs nothing to build.
    fn jobs(n: usize) -> Vec<Job> {
        (0..n).map(|_| Job::Close).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_invocation_never_waits() {
        let (_queue_tx, mut queue) = mpsc::channel(8);
        let mut group = jobs(1);
        let started = Instant::now();
        gather(&mut queue, &mut group, 1, Duration::from_secs(1)).await;
        assert_eq!((group.len(), started.elapsed()), (1, Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_group_waits_for_more_until_it_is_half_the_last() {
        let (queue_tx, mut queue) = mpsc::channel(64);
        let mut group = jobs(1);
        let late = async {
            for _ in 0..4 {
                assert!(queue_tx.send(Job::Close).await.is_ok());
                tokio::task::yield_now().await;
            }
        };
        let started = Instant::now();
        tokio::join!(
            gather(&mut queue, &mut group, 10, Duration::from_secs(1)),
            late
        );
        // The queue stays open: it stopped because 1 + 4 is half of 10, not at a timeout.
        assert_eq!((group.len(), started.elapsed()), (5, Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_is_bounded_by_half_the_last_commit_and_by_gather_max() {
        let (_queue_tx, mut queue) = mpsc::channel(8);
        for (last_commit, waited) in [
            (Duration::from_millis(2), Duration::from_millis(1)),
            (Duration::from_secs(1), GATHER_MAX),
        ] {
            let mut group = jobs(1);
            let started = Instant::now();
            gather(&mut queue, &mut group, 10, last_commit).await;
            assert_eq!((group.len(), started.elapsed()), (1, waited));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_queue_ends_the_wait() {
        let (queue_tx, mut queue) = mpsc::channel(8);
        drop(queue_tx);
        let mut group = jobs(1);
        let started = Instant::now();
        gather(&mut queue, &mut group, 10, Duration::from_secs(1)).await;
        assert_eq!((group.len(), started.elapsed()), (1, Duration::ZERO));
    }
}
