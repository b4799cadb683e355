//! A demo tool executor: the example to copy when you write your own.
//!
//! It is built on `agentloop-executor`, which implements the `ToolExecutorService`
//! contract (`proto/agentloop/v1/tool_executor.proto`) around typed tools, and serves
//! three of them ([`tools`]): `lookup` (read-only key/value), `sleep` (read-only; stops
//! as soon as the caller gives up) and `transfer` (a write that must happen exactly once
//! per effect key). What to copy:
//!
//! 1. **A tool is a type.** Its name, description, side effect and timeout are
//!    constants, its arguments a `Deserialize + JsonSchema` struct (the schema the model
//!    sees is derived from it), its call an `async fn` that returns an output or a
//!    structured error ([`tools`]).
//! 2. **Writes are deduped on the effect key by the library.** The executor records a
//!    write's output durably before it replies; a second `Execute` with an applied key
//!    returns the *original* result and does not call the tool ([`record`] reads that
//!    record back).
//! 3. **`Reconcile` is answered from the same record**, and so is the one verifier,
//!    `transfer_recorded` ([`verifier`]), which judges a final answer against it: the
//!    transfers the answer rests on must be in it, as claimed. Any other verifier name
//!    is NOT_FOUND.
//! 4. **One [`run`]** serves it all with health, caller authentication and a drain.
//!
//! Beside the part to copy, it injects faults on demand ([`FaultConfig`]) so chaos
//! tests can lose replies after an apply, fail before one, or delay a reply past the
//! caller's deadline: [`DemoExecutor`] wraps the library's executor to do that, which is
//! also how to add counters or audit around one.
//!
//! It is *not* production code for money: balances are not tracked, and the record is
//! a local file held in memory.

#![warn(missing_docs)]

mod error;
pub mod record;
pub mod tools;
pub mod verifier;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop_executor::{Disposition, Executor, ExecutorService, StageStream};
use agentloop_proto::v1::tool_executor_service_server::ToolExecutorService;
use agentloop_proto::v1::{
    DescribeRequest, DescribeResponse, ToolExecutorServiceExecuteRequest,
    ToolExecutorServiceExecuteResponse, ToolExecutorServiceExecuteStageRequest,
    ToolExecutorServiceReconcileRequest, ToolExecutorServiceReconcileResponse,
    ToolExecutorServiceVerifyRequest, ToolExecutorServiceVerifyResponse,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

pub use agentloop_executor::{
    MAX_ARGUMENTS_BYTES, MAX_EFFECT_KEY_BYTES, MAX_ID_BYTES, RecordError,
};
pub use error::DemoError;
pub use record::{AppliedTransfer, read_record};
pub use tools::{TRANSFER_RECORDED, VerifierInfo, descriptors, verifiers};

use tools::{Lookup, Sleep, TRANSFER, Transfer};
use verifier::TransferRecorded;

/// Largest lookup data file accepted, in bytes.
pub const MAX_DATA_FILE_BYTES: u64 = 1024 * 1024;
/// Longest reply delay fault accepted, in milliseconds.
pub const MAX_REPLY_DELAY_MS: u64 = 600_000;

/// Configuration of the demo executor (file, `AGENTLOOP_DEMO_EXECUTOR_*` env, flags).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DemoConfig {
    /// The settings every service has: `listen`, `metrics_listen`, `[auth]`,
    /// `insecure_no_auth`, `[telemetry]`, `[server_tls]`.
    #[serde(flatten)]
    pub server: agentloop_server::ServerSettings,
    /// Directory of the transfer record (`transfers.jsonl`); created if missing.
    pub data_dir: PathBuf,
    /// Optional JSON file `{"key": "value", ...}` of extra lookup entries.
    pub data_file: Option<PathBuf>,
    /// Faults to inject into `transfer` (all off by default).
    pub faults: FaultConfig,
    /// Keys no setting took: refused as the configuration loads.
    #[serde(flatten)]
    pub unknown: agentloop_server::UnknownKeys,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            server: agentloop_server::ServerSettings::on_port(50061),
            data_dir: PathBuf::from("agentloop-demo-data"),
            data_file: None,
            faults: FaultConfig::default(),
            unknown: agentloop_server::UnknownKeys,
        }
    }
}

/// The shared start (`agentloop_server::Service::start`) binds `listen`.
impl agentloop_server::ServiceConfig for DemoConfig {
    type Auth = agentloop_auth::CallersConfig;

    fn server(&self) -> &agentloop_server::ServerSettings {
        &self.server
    }
}

/// Faults injected into `transfer`, for chaos tests. Each `transfer` request rolls the
/// dice once, in arrival order and before the executor looks at it, from one RNG, so a
/// fixed `seed` and a fixed request order give a fixed sequence of faults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Probability (0..=1) of failing with UNAVAILABLE before anything is applied.
    pub fail_before_apply: f64,
    /// Probability (0..=1) of applying durably, then answering UNAVAILABLE as if the
    /// reply had been lost: the caller cannot know the transfer happened.
    pub drop_reply_after_apply: f64,
    /// Delay after applying and before replying, so a caller's deadline can pass while
    /// the effect is already applied.
    pub reply_delay_ms: u64,
    /// Probability (0..=1) that a reply is delayed by `reply_delay_ms` (1: every one).
    pub slow_reply: f64,
    /// Seed of the fault RNG; unset seeds from the OS.
    pub seed: Option<u64>,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            fail_before_apply: 0.0,
            drop_reply_after_apply: 0.0,
            reply_delay_ms: 0,
            slow_reply: 1.0,
            seed: None,
        }
    }
}

impl FaultConfig {
    /// Checks the probabilities and the delay; [`DemoExecutor::open`] does too.
    pub fn validate(&self) -> Result<(), DemoError> {
        for (name, p) in [
            ("fail_before_apply", self.fail_before_apply),
            ("drop_reply_after_apply", self.drop_reply_after_apply),
            ("slow_reply", self.slow_reply),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(DemoError::InvalidConfig(format!(
                    "faults.{name} must be a probability in 0..=1, got {p}"
                )));
            }
        }
        if self.reply_delay_ms > MAX_REPLY_DELAY_MS {
            return Err(DemoError::InvalidConfig(format!(
                "faults.reply_delay_ms must be at most {MAX_REPLY_DELAY_MS}"
            )));
        }
        Ok(())
    }
}

/// Counters of what this process did, for tests and chaos checks. The record file
/// ([`read_record`]) stays the ground truth; these count events since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DemoStats {
    /// Transfers newly applied (recorded durably).
    pub applied: u64,
    /// Transfers answered from the record because their effect key was applied before.
    pub deduplicated: u64,
    /// Injected `fail_before_apply` faults.
    pub failed_before_apply: u64,
    /// Injected `drop_reply_after_apply` faults (each one an applied transfer).
    pub dropped_replies: u64,
    /// Replies delayed by `reply_delay_ms`.
    pub delayed_replies: u64,
    /// `sleep` calls that started sleeping.
    pub sleeps_started: u64,
    /// `sleep` calls dropped before they finished (the caller cancelled or timed out).
    pub sleeps_cancelled: u64,
}

/// The fault dice: one seeded RNG behind a mutex.
#[derive(Debug)]
struct Faults {
    config: FaultConfig,
    rng: Mutex<StdRng>,
}

/// What the dice said for one request.
#[derive(Debug, Clone, Copy)]
struct FaultPlan {
    fail_before_apply: bool,
    drop_reply: bool,
    slow_reply: bool,
}

impl Faults {
    fn new(config: FaultConfig) -> Faults {
        let rng = match config.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Faults {
            config,
            rng: Mutex::new(rng),
        }
    }

    fn roll(&self) -> FaultPlan {
        // A poisoned lock only means another thread panicked mid-roll; the RNG state
        // is still a valid RNG state.
        let mut rng = self
            .rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Always draw both numbers, so one fault's setting does not shift the other's
        // sequence. `random::<f64>()` is in [0, 1): p = 0 never fires, p = 1 always does.
        let fail: f64 = rng.random();
        let drop: f64 = rng.random();
        let slow: f64 = rng.random();
        FaultPlan {
            fail_before_apply: fail < self.config.fail_before_apply,
            drop_reply: drop < self.config.drop_reply_after_apply,
            slow_reply: self.config.reply_delay_ms > 0 && slow < self.config.slow_reply,
        }
    }
}

/// The counters, shared by the executor's wrapper and the `sleep` tool.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stats(Arc<watch::Sender<DemoStats>>);

impl Stats {
    pub(crate) fn count(&self, update: impl FnOnce(&mut DemoStats)) {
        self.0.send_modify(update);
    }
}

/// The demo executor: `agentloop-executor`'s [`Executor`] over the demo tools, the
/// verifier and the record, wrapped to count what it does and to inject faults. Cheap to
/// clone (shared state behind an `Arc`); serve it with [`run`], or in-process as any
/// `ToolExecutorService`.
#[derive(Debug, Clone)]
pub struct DemoExecutor {
    executor: Executor,
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    data_dir: PathBuf,
    faults: Faults,
    stats: Stats,
}

impl DemoExecutor {
    /// Opens the executor: loads the lookup data and the transfer record (cutting a
    /// torn last line), and sets up the fault dice.
    ///
    /// # Errors
    ///
    /// [`DemoError::InvalidConfig`] for out-of-range faults, [`DemoError::DataFile`] for
    /// a bad lookup file, [`DemoError::Record`] / [`DemoError::LegacyRecord`] for the
    /// record.
    pub fn open(config: DemoConfig) -> Result<DemoExecutor, DemoError> {
        config.faults.validate()?;
        let mut lookup = BTreeMap::from([
            ("profile".to_owned(), "active".to_owned()),
            ("policy".to_owned(), "refund-under-100".to_owned()),
        ]);
        if let Some(path) = &config.data_file {
            lookup.extend(load_data_file(path)?);
        }
        let record = record::open(&config.data_dir)?;
        let stats = Stats::default();
        // The whole executor: its tools, its verifier and the record they share.
        let executor = Executor::builder()
            .record(record.clone())
            .tool(Lookup::new(lookup))
            .tool(Sleep::new(stats.clone()))
            .tool(Transfer::new(&record)?)
            .verifier(TransferRecorded::new(record))
            .build()?;
        Ok(DemoExecutor {
            executor,
            inner: Arc::new(Inner {
                data_dir: config.data_dir,
                faults: Faults::new(config.faults),
                stats,
            }),
        })
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DemoStats {
        *self.inner.stats.0.borrow()
    }

    /// A receiver that sees every change of the counters, so a test can wait for an
    /// event (`wait_for(|s| s.sleeps_cancelled == 1)`) instead of sleeping.
    pub fn watch_stats(&self) -> watch::Receiver<DemoStats> {
        self.inner.stats.0.subscribe()
    }

    /// The directory holding the transfer record.
    pub fn data_dir(&self) -> &Path {
        &self.inner.data_dir
    }

    fn count(&self, update: impl FnOnce(&mut DemoStats)) {
        self.inner.stats.count(update);
    }
}

fn load_data_file(path: &Path) -> Result<BTreeMap<String, String>, DemoError> {
    let bad = |reason: String| DemoError::DataFile {
        path: path.to_owned(),
        reason,
    };
    let size = std::fs::metadata(path)
        .map_err(|e| bad(e.to_string()))?
        .len();
    if size > MAX_DATA_FILE_BYTES {
        return Err(bad(format!("larger than {MAX_DATA_FILE_BYTES} bytes")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_str(&text)
        .map_err(|e| bad(format!("expected a JSON object of string values: {e}")))
}

/// The executor whose calls a drain that runs out of time cancels.
impl ExecutorService for DemoExecutor {
    fn executor(&self) -> &Executor {
        &self.executor
    }
}

/// The library's executor, with the counters and the faults around `Execute`.
#[tonic::async_trait]
impl ToolExecutorService for DemoExecutor {
    async fn describe(
        &self,
        request: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        self.executor.describe(request).await
    }

    async fn execute(
        &self,
        request: Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<Response<ToolExecutorServiceExecuteResponse>, Status> {
        // 1. Fault dice, rolled once per transfer request in arrival order.
        let is_transfer = request
            .get_ref()
            .call
            .as_ref()
            .is_some_and(|call| call.tool == TRANSFER);
        let faults = is_transfer.then(|| self.inner.faults.roll());
        if faults.is_some_and(|plan| plan.fail_before_apply) {
            self.count(|s| s.failed_before_apply += 1);
            return Err(DemoError::InjectedFailBeforeApply.into());
        }

        // 2. The executor: bounds, arguments, the key's lock, the record, the tool.
        let executed = self.executor.execute_request(request).await?;
        match executed.disposition() {
            Disposition::Applied => self.count(|s| s.applied += 1),
            Disposition::Replayed => self.count(|s| s.deduplicated += 1),
            Disposition::Read | Disposition::Failed => {
                return Ok(Response::new(executed.into_response()));
            }
        }

        // 3. Faults that happen after the effect: a slow reply (the caller's deadline
        //    may pass; the effect stays applied) and a lost reply.
        if let Some(plan) = faults {
            if plan.slow_reply {
                self.count(|s| s.delayed_replies += 1);
                tokio::time::sleep(Duration::from_millis(
                    self.inner.faults.config.reply_delay_ms,
                ))
                .await;
            }
            if plan.drop_reply {
                self.count(|s| s.dropped_replies += 1);
                return Err(DemoError::InjectedDroppedReply.into());
            }
        }
        Ok(Response::new(executed.into_response()))
    }

    type ExecuteStageStream = StageStream;

    /// A stage holds reads only, which no fault of this executor touches.
    async fn execute_stage(
        &self,
        request: Request<ToolExecutorServiceExecuteStageRequest>,
    ) -> Result<Response<StageStream>, Status> {
        self.executor.execute_stage(request).await
    }

    async fn reconcile(
        &self,
        request: Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<Response<ToolExecutorServiceReconcileResponse>, Status> {
        self.executor.reconcile(request).await
    }

    async fn verify(
        &self,
        request: Request<ToolExecutorServiceVerifyRequest>,
    ) -> Result<Response<ToolExecutorServiceVerifyResponse>, Status> {
        self.executor.verify(request).await
    }
}

/// Serves `executor` on `listener` (with health, reflection and tracing from
/// `agentloop-server`, behind `access`) until `shutdown` resolves, then drains
/// in-flight calls ([`agentloop_executor::serve`]).
///
/// # Errors
///
/// When the server fails to start or to serve.
pub async fn run(
    listener: tokio::net::TcpListener,
    executor: DemoExecutor,
    access: agentloop_server::Access,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), agentloop_server::ServeError> {
    agentloop_executor::serve(listener, executor, access, shutdown).await
}
