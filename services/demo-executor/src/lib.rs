//! A demo tool executor: the example to copy when you write your own.
//!
//! It serves three tools over the `ToolExecutorService` contract
//! (`proto/agentloop/v1/tool_executor.proto`): `lookup` (read-only key/value),
//! `sleep` (read-only; stops as soon as the caller gives up) and `transfer` (a write
//! that must happen exactly once per effect key). The comments explain the three rules
//! every executor must keep:
//!
//! 1. **Dedupe on the effect key.** The executor owns the data, so it enforces the key:
//!    a second `Execute` with an applied key returns the *original* result and changes
//!    nothing (see [`record`]).
//! 2. **Start no side effect the caller no longer wants.** In tonic, a cancelled or
//!    timed-out call drops the handler's future, so code after an `.await` simply does
//!    not run. Everything before the durable append can be abandoned; the append itself
//!    runs to completion or not at all.
//! 3. **Answer `Reconcile` from your own records.** Every apply is recorded durably
//!    before it is acknowledged, so "not in the record" means "not applied".
//!
//! It also serves one verifier, `transfer_recorded` ([`verifier`]), which judges a
//! final answer against the same record: the transfers the answer rests on must be in
//! it, as claimed. Any other verifier name is NOT_FOUND.
//!
//! It also injects faults on demand ([`FaultConfig`]) so chaos tests can lose replies
//! after an apply, fail before one, or delay a reply past the caller's deadline.
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
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop_proto::v1::tool_executor_service_server::ToolExecutorService;
use agentloop_proto::v1::tool_result::Outcome;
use agentloop_proto::v1::{
    DescribeRequest, DescribeResponse, ErrorType, NextAction, ReconcileStatus, ToolCall,
    ToolExecutorServiceExecuteRequest, ToolExecutorServiceExecuteResponse,
    ToolExecutorServiceReconcileRequest, ToolExecutorServiceReconcileResponse,
    ToolExecutorServiceVerifyRequest, ToolExecutorServiceVerifyResponse, ToolOutput, ToolResult,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

pub use error::DemoError;
pub use record::{AppliedTransfer, read_record};
pub use tools::{TRANSFER_RECORDED, VerifierInfo, descriptors, verifiers};

use record::{Applied, EffectRecord};
use tools::{LOOKUP, SLEEP, TRANSFER};

/// Longest effect key accepted, in bytes. Keys are identifiers, not payloads.
pub const MAX_EFFECT_KEY_BYTES: usize = 256;
/// Longest invocation ID, call ID or tool name accepted, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Largest `arguments_json` accepted, in bytes; the demo tools need a few dozen.
pub const MAX_ARGUMENTS_BYTES: usize = 64 * 1024;
/// Largest lookup data file accepted, in bytes.
pub const MAX_DATA_FILE_BYTES: u64 = 1024 * 1024;
/// Longest reply delay fault accepted, in milliseconds.
pub const MAX_REPLY_DELAY_MS: u64 = 600_000;

/// Configuration of the demo executor (file, `AGENTLOOP_DEMO_EXECUTOR_*` env, flags).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DemoConfig {
    /// Address to serve on.
    pub listen: SocketAddr,
    /// The callers it accepts, each by its service token (`[[auth.callers]]`). With
    /// none, anyone who reaches the port is served, so it must be loopback (or
    /// `insecure_no_auth`).
    pub auth: agentloop_auth::CallersConfig,
    /// Serve a non-loopback address without `auth` all the same (`--insecure-no-auth`).
    pub insecure_no_auth: bool,
    /// TLS on the listener; with `client_ca_file`, mutual TLS, and `auth.callers` may name
    /// callers by the SPIFFE ID of their certificates.
    pub server_tls: Option<agentloop_server::ServerTls>,
    /// Directory of the transfer record (`transfers.jsonl`); created if missing.
    pub data_dir: PathBuf,
    /// Optional JSON file `{"key": "value", ...}` of extra lookup entries.
    pub data_file: Option<PathBuf>,
    /// Faults to inject into `transfer` (all off by default).
    pub faults: FaultConfig,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 50061)),
            auth: agentloop_auth::CallersConfig::default(),
            insecure_no_auth: false,
            server_tls: None,
            data_dir: PathBuf::from("agentloop-demo-data"),
            data_file: None,
            faults: FaultConfig::default(),
        }
    }
}

/// The shared start (`agentloop_server::Service::start`) binds `listen`.
impl agentloop_server::ServiceConfig for DemoConfig {
    fn listen(&self) -> SocketAddr {
        self.listen
    }

    fn authenticates_callers(&self) -> bool {
        self.auth.is_on()
    }

    fn insecure_no_auth(&self) -> bool {
        self.insecure_no_auth
    }
}

/// Faults injected into `transfer`, for chaos tests. Each request rolls the dice once,
/// in arrival order, from one RNG, so a fixed `seed` and a fixed request order give a
/// fixed sequence of faults.
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

/// The demo executor. Cheap to clone (shared state behind an `Arc`); serve it with
/// [`agentloop_proto::server::tool_executor`] or [`run`].
#[derive(Debug, Clone)]
pub struct DemoExecutor {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    lookup: BTreeMap<String, String>,
    /// A std mutex: it is only held inside `spawn_blocking` (for the append) or for an
    /// in-memory read, never across an `.await`.
    record: Arc<Mutex<EffectRecord>>,
    data_dir: PathBuf,
    faults: Faults,
    stats: watch::Sender<DemoStats>,
}

impl DemoExecutor {
    /// Opens the executor: loads the lookup data and the transfer record (cutting a
    /// torn last line), and sets up the fault dice.
    ///
    /// # Errors
    ///
    /// [`DemoError::InvalidConfig`] for out-of-range faults, [`DemoError::DataFile`] for
    /// a bad lookup file, [`DemoError::Io`] / [`DemoError::CorruptRecord`] for the record.
    pub fn open(config: DemoConfig) -> Result<DemoExecutor, DemoError> {
        config.faults.validate()?;
        let mut lookup = BTreeMap::from([
            ("profile".to_owned(), "active".to_owned()),
            ("policy".to_owned(), "refund-under-100".to_owned()),
        ]);
        if let Some(path) = &config.data_file {
            lookup.extend(load_data_file(path)?);
        }
        let record = EffectRecord::open(&config.data_dir)?;
        Ok(DemoExecutor {
            inner: Arc::new(Inner {
                lookup,
                record: Arc::new(Mutex::new(record)),
                data_dir: config.data_dir,
                faults: Faults::new(config.faults),
                stats: watch::Sender::new(DemoStats::default()),
            }),
        })
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DemoStats {
        *self.inner.stats.borrow()
    }

    /// A receiver that sees every change of the counters, so a test can wait for an
    /// event (`wait_for(|s| s.sleeps_cancelled == 1)`) instead of sleeping.
    pub fn watch_stats(&self) -> watch::Receiver<DemoStats> {
        self.inner.stats.subscribe()
    }

    /// The directory holding the transfer record.
    pub fn data_dir(&self) -> &Path {
        &self.inner.data_dir
    }

    fn count(&self, update: impl FnOnce(&mut DemoStats)) {
        self.inner.stats.send_modify(update);
    }

    fn lookup(&self, call: &ToolCall) -> Outcome {
        let args: tools::LookupArgs = match tools::parse_args(LOOKUP, &call.arguments_json) {
            Ok(args) => args,
            Err(error) => return Outcome::Error(error),
        };
        match self.inner.lookup.get(&args.key) {
            Some(value) => output(serde_json::json!({ "key": args.key, "value": value }), ""),
            None => Outcome::Error(tools::tool_error(
                ErrorType::NotFound,
                format!("no entry for key {:?}", args.key),
                false,
                NextAction::FixArguments,
            )),
        }
    }

    async fn sleep(&self, call: &ToolCall) -> Outcome {
        let args: tools::SleepArgs = match tools::parse_args(SLEEP, &call.arguments_json)
            .and_then(|args| tools::check_sleep(&args).map(|()| args))
        {
            Ok(args) => args,
            Err(error) => return Outcome::Error(error),
        };
        // The guard counts a cancellation when it is dropped unfinished: tonic drops
        // this whole future when the caller goes away, and the guard with it.
        let mut guard = SleepGuard {
            executor: self,
            finished: false,
        };
        self.count(|s| s.sleeps_started += 1);
        // A plain `tokio::time::sleep`: no thread is parked, and dropping the future
        // stops it at once. Nothing else is needed to honour cancellation.
        tokio::time::sleep(Duration::from_millis(args.ms)).await;
        guard.finished = true;
        output(serde_json::json!({ "slept_ms": args.ms }), "")
    }

    /// The write. Read the order of the steps: it is the point of this crate.
    async fn transfer(
        &self,
        request: &ToolExecutorServiceExecuteRequest,
        call: &ToolCall,
    ) -> Result<Outcome, DemoError> {
        // 1. A write without an effect key cannot be deduped: refuse it as a bad
        //    request (INVALID_ARGUMENT), before anything else.
        let effect_key = check_effect_key(&request.effect_key)?.to_owned();

        // 2. Arguments: a bad one is the model's to fix, so it is a structured result.
        let args: tools::TransferArgs = match tools::parse_args(TRANSFER, &call.arguments_json)
            .and_then(|args| tools::check_transfer(&args).map(|()| args))
        {
            Ok(args) => args,
            Err(error) => return Ok(Outcome::Error(error)),
        };

        // 3. Fault dice, rolled once per request in arrival order.
        let faults = self.inner.faults.roll();
        if faults.fail_before_apply {
            self.count(|s| s.failed_before_apply += 1);
            return Err(DemoError::InjectedFailBeforeApply);
        }

        // 4. Apply: the dedupe check and the durable append, as one step under the
        //    record's mutex, on a blocking thread (fsync blocks).
        //
        //    Cancellation: we only get here while tonic still polls this future, i.e.
        //    while the caller still wants the call. Everything above may be abandoned at
        //    any `.await` and nothing has happened. From here on the blocking task runs
        //    to completion even if the caller goes away (dropping a `JoinHandle` does
        //    not stop the task): the append is atomic, so the effect is either recorded
        //    or not, never half-done, and a lost reply is exactly the case `Reconcile`
        //    answers. That is why the append is the *last* step before the reply, and
        //    why nothing that could fail or wait comes between the append and
        //    returning (except the faults that simulate precisely that).
        let record = Arc::clone(&self.inner.record);
        let invocation_id = request.invocation_id.clone();
        let call_id = call.call_id.clone();
        let attempt = request.attempt;
        let applied = tokio::task::spawn_blocking(move || {
            let mut record = record
                .lock()
                .map_err(|_| DemoError::RecordUnavailable("record lock poisoned".to_owned()))?;
            record.apply(&effect_key.clone(), move |sequence| {
                let receipt = format!("txn-{sequence:08}");
                let output = serde_json::json!({
                    "receipt": receipt, "from": args.from, "to": args.to, "amount": args.amount,
                });
                AppliedTransfer {
                    effect_key,
                    invocation_id,
                    call_id,
                    attempt,
                    from: args.from,
                    to: args.to,
                    amount: args.amount,
                    receipt,
                    output_json: output.to_string(),
                }
            })
        })
        .await
        .map_err(|e| DemoError::RecordUnavailable(format!("apply task failed: {e}")))??;

        let entry = match applied {
            Applied::New(entry) => {
                self.count(|s| s.applied += 1);
                tracing::info!(effect_key = %entry.effect_key, receipt = %entry.receipt, "transfer applied");
                entry
            }
            Applied::Existing(entry) => {
                // The same key with different arguments is a caller bug: answering with
                // the first receipt would hide it, applying again would break the rule.
                if !same_transfer(&entry, &call.arguments_json) {
                    return Ok(Outcome::Error(tools::tool_error(
                        ErrorType::Conflict,
                        format!(
                            "effect key {:?} was already applied with different arguments",
                            entry.effect_key
                        ),
                        false,
                        NextAction::Stop,
                    )));
                }
                self.count(|s| s.deduplicated += 1);
                tracing::info!(effect_key = %entry.effect_key, receipt = %entry.receipt, "duplicate transfer: original receipt returned");
                entry
            }
        };

        // 5. Faults that happen after the effect: a slow reply (the caller's deadline
        //    may pass; the effect stays applied) and a lost reply.
        if faults.slow_reply {
            self.count(|s| s.delayed_replies += 1);
            tokio::time::sleep(Duration::from_millis(
                self.inner.faults.config.reply_delay_ms,
            ))
            .await;
        }
        if faults.drop_reply {
            self.count(|s| s.dropped_replies += 1);
            return Err(DemoError::InjectedDroppedReply);
        }
        Ok(Outcome::Output(ToolOutput {
            output_json: entry.output_json,
            receipt: entry.receipt,
        }))
    }
}

/// Whether `arguments_json` asks for the same transfer as `entry`.
fn same_transfer(entry: &AppliedTransfer, arguments_json: &str) -> bool {
    serde_json::from_str::<tools::TransferArgs>(arguments_json).is_ok_and(|args| {
        args.from == entry.from && args.to == entry.to && args.amount == entry.amount
    })
}

struct SleepGuard<'a> {
    executor: &'a DemoExecutor,
    finished: bool,
}

impl Drop for SleepGuard<'_> {
    fn drop(&mut self) {
        if !self.finished {
            tracing::info!("sleep cancelled by the caller");
            self.executor.count(|s| s.sleeps_cancelled += 1);
        }
    }
}

fn output(value: serde_json::Value, receipt: &str) -> Outcome {
    Outcome::Output(ToolOutput {
        output_json: value.to_string(),
        receipt: receipt.to_owned(),
    })
}

fn check_effect_key(key: &str) -> Result<&str, DemoError> {
    if key.is_empty() {
        return Err(DemoError::InvalidRequest(
            "transfer is a write and needs an effect key".to_owned(),
        ));
    }
    if key.len() > MAX_EFFECT_KEY_BYTES {
        return Err(DemoError::InvalidRequest(format!(
            "effect key longer than {MAX_EFFECT_KEY_BYTES} bytes"
        )));
    }
    Ok(key)
}

fn check_bounds(
    request: &ToolExecutorServiceExecuteRequest,
    call: &ToolCall,
) -> Result<(), DemoError> {
    for (field, value) in [
        ("invocation_id", &request.invocation_id),
        ("call.call_id", &call.call_id),
        ("call.tool", &call.tool),
    ] {
        if value.len() > MAX_ID_BYTES {
            return Err(DemoError::InvalidRequest(format!(
                "{field} longer than {MAX_ID_BYTES} bytes"
            )));
        }
    }
    if call.arguments_json.len() > MAX_ARGUMENTS_BYTES {
        return Err(DemoError::InvalidRequest(format!(
            "arguments_json larger than {MAX_ARGUMENTS_BYTES} bytes"
        )));
    }
    Ok(())
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

#[tonic::async_trait]
impl ToolExecutorService for DemoExecutor {
    async fn describe(
        &self,
        _request: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        Ok(Response::new(DescribeResponse {
            tools: descriptors(),
        }))
    }

    async fn execute(
        &self,
        request: Request<ToolExecutorServiceExecuteRequest>,
    ) -> Result<Response<ToolExecutorServiceExecuteResponse>, Status> {
        // Who calls, as the guard in front of this service established it (`auth.callers`):
        // a tool owner's executor can refuse or attribute by it. `None` when the port is
        // open or the call comes in-process.
        let caller = request
            .extensions()
            .get::<agentloop_auth::Caller>()
            .map(|caller| caller.0.clone());
        let request = request.into_inner();
        let call = request
            .call
            .clone()
            .ok_or_else(|| DemoError::InvalidRequest("call is required".to_owned()))?;
        tracing::debug!(caller = caller.as_deref().unwrap_or("-"), tool = %call.tool, call = %call.call_id, "execute");
        check_bounds(&request, &call)?;
        let outcome = match call.tool.as_str() {
            LOOKUP => self.lookup(&call),
            SLEEP => self.sleep(&call).await,
            TRANSFER => self.transfer(&request, &call).await?,
            other => return Err(DemoError::UnknownTool(other.to_owned()).into()),
        };
        Ok(Response::new(ToolExecutorServiceExecuteResponse {
            result: Some(ToolResult {
                call_id: call.call_id,
                outcome: Some(outcome),
            }),
        }))
    }

    async fn reconcile(
        &self,
        request: Request<ToolExecutorServiceReconcileRequest>,
    ) -> Result<Response<ToolExecutorServiceReconcileResponse>, Status> {
        let request = request.into_inner();
        match request.tool.as_str() {
            TRANSFER => {}
            LOOKUP | SLEEP => return Err(DemoError::NotReconcilable(request.tool).into()),
            other => return Err(DemoError::UnknownTool(other.to_owned()).into()),
        }
        let key = check_effect_key(&request.effect_key)?;
        let record = self
            .inner
            .record
            .lock()
            .map_err(|_| DemoError::RecordUnavailable("record lock poisoned".to_owned()))?;
        let response = match record.lookup(key) {
            Ok(Some(entry)) => ToolExecutorServiceReconcileResponse {
                status: ReconcileStatus::Applied as i32,
                receipt: entry.receipt.clone(),
                output_json: entry.output_json.clone(),
                detail: format!(
                    "applied by attempt {} of call {}",
                    entry.attempt, entry.call_id
                ),
            },
            // Every apply is recorded before it is acknowledged, so absence means it
            // never happened. A request with this key still in flight would be deduped
            // on the same key if it applies later, so re-dispatching stays safe.
            Ok(None) => ToolExecutorServiceReconcileResponse {
                status: ReconcileStatus::NotApplied as i32,
                detail: "no transfer recorded under this effect key".to_owned(),
                ..Default::default()
            },
            // The record is in doubt after a failed rollback: the honest answer.
            Err(reason) => ToolExecutorServiceReconcileResponse {
                status: ReconcileStatus::Unknown as i32,
                detail: reason,
                ..Default::default()
            },
        };
        Ok(Response::new(response))
    }

    async fn verify(
        &self,
        request: Request<ToolExecutorServiceVerifyRequest>,
    ) -> Result<Response<ToolExecutorServiceVerifyResponse>, Status> {
        let request = request.into_inner();
        if request.verifier != TRANSFER_RECORDED {
            return Err(DemoError::UnknownVerifier(request.verifier).into());
        }
        let claim = request
            .claim
            .ok_or_else(|| DemoError::InvalidRequest("claim is required".to_owned()))?;
        // Held for in-memory lookups only, like Reconcile's.
        let record = self
            .inner
            .record
            .lock()
            .map_err(|_| DemoError::RecordUnavailable("record lock poisoned".to_owned()))?;
        Ok(Response::new(verifier::transfer_recorded(&record, &claim)))
    }
}

/// Serves `executor` on `listener` (with health, reflection and tracing from
/// `agentloop-server`) until `shutdown` resolves, then drains in-flight calls.
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
    let services = agentloop_server::ServiceSet::new()
        .add_for(agentloop_proto::server::tool_executor(executor), &access);
    agentloop_server::serve(listener, services, shutdown).await
}
