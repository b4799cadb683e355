//! The three demo tools, each an [`agentloop_executor::Tool`]: what the model is told
//! about them (constants and argument types), and their calls.
//!
//! Each tool's JSON Schema is derived from its argument type; the policy service
//! validates arguments against it before a call is ever dispatched. The executor still
//! parses the arguments strictly itself (serde with `deny_unknown_fields`), because an
//! executor must never trust that every caller validated, and each call checks what a
//! schema cannot say (a sleep's maximum, two different accounts).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agentloop_executor::{CallError, Context, Record, SideEffect, Tool, Verifier, descriptor};
use agentloop_proto::v1::ToolDescriptor;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::verifier::TransferRecorded;
use crate::{DemoError, Stats};

/// Name of the read-only key/value lookup tool.
pub const LOOKUP: &str = "lookup";
/// Name of the read-only sleep tool (for cancellation and deadline tests).
pub const SLEEP: &str = "sleep";
/// Name of the transfer tool, the one write.
pub const TRANSFER: &str = "transfer";
/// Name of the one verifier: each transfer a final answer rests on is in the record.
pub const TRANSFER_RECORDED: &str = "transfer_recorded";

/// A verifier this executor serves, for whoever registers the executor at a gateway by
/// hand (a `[[verifiers]]` entry, or a stack built in code); `Describe` lists them too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifierInfo {
    /// The name to register it under; `Verify` refuses any other.
    pub name: &'static str,
    /// What it confirms.
    pub description: &'static str,
}

/// The verifiers of the demo executor.
pub fn verifiers() -> Vec<VerifierInfo> {
    vec![VerifierInfo {
        name: TransferRecorded::NAME,
        description: TransferRecorded::DESCRIPTION,
    }]
}

/// The descriptors of the demo tools, as `Describe` returns them.
pub fn descriptors() -> Vec<ToolDescriptor> {
    vec![
        descriptor::<Lookup>(),
        descriptor::<Sleep>(),
        descriptor::<Transfer>(),
    ]
}

/// Longest sleep the `sleep` tool accepts, in milliseconds (ten minutes).
pub const MAX_SLEEP_MS: u64 = 600_000;

/// Longest account name `transfer` accepts, in bytes.
pub const MAX_ACCOUNT_BYTES: usize = 128;

/// Arguments of `lookup`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct LookupArgs {
    /// The key to look up, e.g. "profile" or "policy".
    #[schemars(length(min = 1, max = 256))]
    key: String,
}

/// What `lookup` returns.
#[derive(Debug, Serialize)]
pub(crate) struct LookupOutput {
    key: String,
    value: String,
}

/// `lookup`: a read-only key/value table (built-in entries plus the data file's).
#[derive(Debug)]
pub(crate) struct Lookup {
    table: BTreeMap<String, String>,
}

impl Lookup {
    pub(crate) fn new(table: BTreeMap<String, String>) -> Lookup {
        Lookup { table }
    }
}

impl Tool for Lookup {
    const NAME: &'static str = LOOKUP;
    const DESCRIPTION: &'static str = "Looks up a value by key in a small reference table \
        (for example the key \"profile\" or \"policy\"). Returns {\"key\", \"value\"}. \
        Read-only: safe to call again. An unknown key fails with NOT_FOUND; do not retry it \
        unchanged.";
    const SIDE_EFFECT: SideEffect = SideEffect::ReadOnly;
    const TIMEOUT: Duration = Duration::from_secs(5);
    type Args = LookupArgs;
    type Output = LookupOutput;

    async fn call(&self, args: LookupArgs, _ctx: &Context) -> Result<LookupOutput, CallError> {
        match self.table.get(&args.key) {
            Some(value) => Ok(LookupOutput {
                value: value.clone(),
                key: args.key,
            }),
            // The model's to fix (NOT_FOUND, fix the arguments), not a failure of ours.
            None => Err(CallError::not_found(format!(
                "no entry for key {:?}",
                args.key
            ))),
        }
    }
}

/// Arguments of `sleep`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SleepArgs {
    /// How long to wait, in milliseconds.
    #[schemars(range(max = 600_000))]
    ms: u64,
}

/// What `sleep` returns.
#[derive(Debug, Serialize)]
pub(crate) struct Slept {
    slept_ms: u64,
}

/// `sleep`: waits, changing nothing; counts the sleeps started and abandoned.
#[derive(Debug)]
pub(crate) struct Sleep {
    stats: Stats,
}

impl Sleep {
    pub(crate) fn new(stats: Stats) -> Sleep {
        Sleep { stats }
    }
}

impl Tool for Sleep {
    const NAME: &'static str = SLEEP;
    const DESCRIPTION: &'static str = "Waits for the given number of milliseconds, then \
        returns {\"slept_ms\"}. Changes nothing; useful to test deadlines and cancellation.";
    const SIDE_EFFECT: SideEffect = SideEffect::ReadOnly;
    // The longest sleep plus nothing: a sleep near the maximum may time out, which is
    // exactly what a deadline test wants.
    const TIMEOUT: Duration = Duration::from_millis(MAX_SLEEP_MS);
    type Args = SleepArgs;
    type Output = Slept;

    async fn call(&self, args: SleepArgs, _ctx: &Context) -> Result<Slept, CallError> {
        if args.ms > MAX_SLEEP_MS {
            return Err(CallError::invalid_arguments(format!(
                "ms must be at most {MAX_SLEEP_MS}"
            )));
        }
        // The guard counts a cancellation when it is dropped unfinished: the executor
        // drops this whole future when the caller goes away, and the guard with it.
        let mut guard = SleepGuard {
            stats: &self.stats,
            finished: false,
        };
        self.stats.count(|s| s.sleeps_started += 1);
        // A plain `tokio::time::sleep`: no thread is parked, and dropping the future stops
        // it at once, so nothing else is needed to honour cancellation. Work started
        // elsewhere (a spawned task, a child process) would watch `ctx.cancellation()`.
        tokio::time::sleep(Duration::from_millis(args.ms)).await;
        guard.finished = true;
        Ok(Slept { slept_ms: args.ms })
    }
}

struct SleepGuard<'a> {
    stats: &'a Stats,
    finished: bool,
}

impl Drop for SleepGuard<'_> {
    fn drop(&mut self) {
        if !self.finished {
            tracing::info!("sleep cancelled by the caller");
            self.stats.count(|s| s.sleeps_cancelled += 1);
        }
    }
}

/// Arguments of `transfer`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TransferArgs {
    /// Account to take the money from.
    #[schemars(length(min = 1, max = 128))]
    pub(crate) from: String,
    /// Account to pay the money into.
    #[schemars(length(min = 1, max = 128))]
    pub(crate) to: String,
    /// Amount in minor units (cents); must be positive.
    #[schemars(range(min = 1))]
    pub(crate) amount: u64,
}

/// What `transfer` returns: the receipt, and the transfer it names.
#[derive(Debug, Serialize)]
pub(crate) struct TransferReceipt {
    receipt: String,
    from: String,
    to: String,
    amount: u64,
}

/// `transfer`: the write. Its effect *is* its entry in the executor's record (the demo
/// keeps no balances), so the executor's durable append is the apply, and what the call
/// does is check the transfer and number its receipt. A tool whose effect lives in
/// another system makes the change here, with `ctx.effect_key()` as that system's
/// idempotency key.
#[derive(Debug)]
pub(crate) struct Transfer {
    /// The number of the next receipt (`txn-00000001`, ...).
    next: AtomicU64,
}

impl Transfer {
    /// Numbers receipts on from the highest one in `record`.
    pub(crate) fn new(record: &Record) -> Result<Transfer, DemoError> {
        let last = record
            .entries()?
            .iter()
            .filter(|entry| entry.tool == TRANSFER)
            .filter_map(|entry| entry.receipt.strip_prefix("txn-")?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        Ok(Transfer {
            next: AtomicU64::new(last + 1),
        })
    }
}

impl Tool for Transfer {
    const NAME: &'static str = TRANSFER;
    const DESCRIPTION: &'static str = "Moves a positive amount (in cents) from one account \
        to another. This is a real change: it is applied exactly once per effect key, and the \
        result carries a receipt identifying the transfer. Do not call it again to \"make \
        sure\"; a repeated call with the same effect key returns the first receipt.";
    const SIDE_EFFECT: SideEffect = SideEffect::Write;
    const TIMEOUT: Duration = Duration::from_secs(10);
    type Args = TransferArgs;
    type Output = TransferReceipt;

    fn receipt(output: &TransferReceipt) -> String {
        output.receipt.clone()
    }

    async fn call(&self, args: TransferArgs, _ctx: &Context) -> Result<TransferReceipt, CallError> {
        check_transfer(&args)?;
        // Unique across restarts (the count starts past the record's highest); a number
        // is skipped only if the append then fails.
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        Ok(TransferReceipt {
            receipt: format!("txn-{number:08}"),
            from: args.from,
            to: args.to,
            amount: args.amount,
        })
    }
}

/// Checks the bounds serde cannot express.
fn check_transfer(args: &TransferArgs) -> Result<(), CallError> {
    if args.amount == 0 {
        return Err(CallError::invalid_arguments("amount must be positive"));
    }
    for (field, value) in [("from", &args.from), ("to", &args.to)] {
        if value.is_empty() || value.len() > MAX_ACCOUNT_BYTES {
            return Err(CallError::invalid_arguments(format!(
                "{field} must be 1 to {MAX_ACCOUNT_BYTES} bytes"
            )));
        }
    }
    // A business refusal, not a malformed call: the write is rejected, and the effect
    // ledger says so (the case an answer claiming "moved" must not get past).
    if args.from == args.to {
        return Err(CallError::rejected(
            "from and to are the same account: there is nothing to move",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    use agentloop_executor::ErrorType;

    use super::*;

    #[test]
    fn every_schema_is_a_strict_object_and_every_tool_has_a_timeout() {
        let tools = descriptors();
        assert_eq!(
            tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            [LOOKUP, SLEEP, TRANSFER]
        );
        for tool in tools {
            let schema: serde_json::Value = serde_json::from_str(&tool.input_schema_json).unwrap();
            assert_eq!(schema["type"], "object", "{}", tool.name);
            assert_eq!(schema["additionalProperties"], false, "{}", tool.name);
            assert!(tool.timeout.is_some_and(|t| t.seconds > 0), "{}", tool.name);
            assert!(!tool.description.is_empty());
        }
        let transfer: serde_json::Value =
            serde_json::from_str(&descriptor::<Transfer>().input_schema_json).unwrap();
        assert_eq!(
            transfer["required"],
            serde_json::json!(["from", "to", "amount"])
        );
        assert_eq!(transfer["properties"]["amount"]["minimum"], 1);
        assert_eq!(transfer["properties"]["from"]["maxLength"], 128);
        assert!(
            transfer["properties"]["to"]["description"]
                .as_str()
                .unwrap()
                .contains("pay the money into")
        );
    }

    #[test]
    fn the_schemas_compile_as_policy_compiles_them_and_judge_arguments_as_the_tools_do() {
        let compile = |descriptor: ToolDescriptor| {
            let schema: serde_json::Value =
                serde_json::from_str(&descriptor.input_schema_json).unwrap();
            assert!(schema.get("$schema").is_none(), "{schema}");
            jsonschema::validator_for(&schema).unwrap()
        };
        let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        let transfer = compile(descriptor::<Transfer>());
        assert!(transfer.is_valid(&json(r#"{"from":"a","to":"b","amount":1}"#)));
        for bad in [
            r#"{"from":"a","to":"b","amount":0}"#,
            r#"{"from":"","to":"b","amount":1}"#,
            r#"{"from":"a","to":"b"}"#,
            r#"{"from":"a","to":"b","amount":1,"memo":"x"}"#,
        ] {
            assert!(!transfer.is_valid(&json(bad)), "{bad}");
        }
        let sleep = compile(descriptor::<Sleep>());
        assert!(sleep.is_valid(&json(r#"{"ms":5}"#)));
        assert!(!sleep.is_valid(&json(r#"{"ms":600001}"#)));
        assert!(!sleep.is_valid(&json(r#"{"ms":-1}"#)));
        let lookup = compile(descriptor::<Lookup>());
        assert!(lookup.is_valid(&json(r#"{"key":"profile"}"#)));
        assert!(!lookup.is_valid(&json(r#"{"key":""}"#)));
    }

    fn args(json: &str) -> TransferArgs {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn transfers_are_checked_beyond_their_schema() {
        let same = check_transfer(&args(r#"{"from":"a","to":"a","amount":1}"#)).unwrap_err();
        assert_eq!(same.error_type(), ErrorType::Rejected);
        let zero = check_transfer(&args(r#"{"from":"a","to":"b","amount":0}"#)).unwrap_err();
        assert_eq!(zero.error_type(), ErrorType::InvalidArguments);
        let long = TransferArgs {
            from: "a".repeat(129),
            to: "b".into(),
            amount: 1,
        };
        assert!(check_transfer(&long).is_err());
        assert!(check_transfer(&args(r#"{"from":"a","to":"b","amount":1}"#)).is_ok());
    }
}
