//! The three demo tools: what the model is told about them, and their arguments.
//!
//! Each tool's JSON Schema is what the policy service validates arguments against
//! before a call is ever dispatched; the executor still parses the arguments strictly
//! itself (serde with `deny_unknown_fields`), because an executor must never trust
//! that every caller validated.

use std::time::Duration;

use agentloop_proto::v1::{ErrorType, NextAction, SideEffect, ToolDescriptor, ToolError};
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Name of the read-only key/value lookup tool.
pub const LOOKUP: &str = "lookup";
/// Name of the read-only sleep tool (for cancellation and deadline tests).
pub const SLEEP: &str = "sleep";
/// Name of the transfer tool, the one write.
pub const TRANSFER: &str = "transfer";
/// Name of the one verifier: each transfer a final answer rests on is in the record.
pub const TRANSFER_RECORDED: &str = "transfer_recorded";

/// A verifier this executor serves. `Describe` lists tools only, so whoever registers
/// the executor at a gateway (a `[[verifiers]]` entry, or a stack built in code) takes
/// the names from here.
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
        name: TRANSFER_RECORDED,
        description: "Confirms that every transfer the invocation committed, and every \
                      transfer receipt the answer cites, is in the demo executor's record \
                      as claimed.",
    }]
}

/// Longest sleep the `sleep` tool accepts, in milliseconds (ten minutes).
pub const MAX_SLEEP_MS: u64 = 600_000;

/// Longest account name `transfer` accepts, in bytes.
pub const MAX_ACCOUNT_BYTES: usize = 128;

const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
// The longest sleep plus nothing: a sleep near the maximum may time out, which is
// exactly what a deadline test wants.
const SLEEP_TIMEOUT: Duration = Duration::from_millis(MAX_SLEEP_MS);
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(10);

const LOOKUP_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "key": { "type": "string", "minLength": 1, "maxLength": 256, "description": "The key to look up, e.g. \"profile\" or \"policy\"." }
  },
  "required": ["key"],
  "additionalProperties": false
}"#;

const SLEEP_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "ms": { "type": "integer", "minimum": 0, "maximum": 600000, "description": "How long to wait, in milliseconds." }
  },
  "required": ["ms"],
  "additionalProperties": false
}"#;

const TRANSFER_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "from": { "type": "string", "minLength": 1, "maxLength": 128, "description": "Account to take the money from." },
    "to": { "type": "string", "minLength": 1, "maxLength": 128, "description": "Account to pay the money into." },
    "amount": { "type": "integer", "minimum": 1, "description": "Amount in minor units (cents); must be positive." }
  },
  "required": ["from", "to", "amount"],
  "additionalProperties": false
}"#;

/// The descriptors of the demo tools, as `Describe` returns them.
pub fn descriptors() -> Vec<ToolDescriptor> {
    let descriptor =
        |name: &str, description: &str, schema: &str, side_effect, timeout| ToolDescriptor {
            name: name.to_owned(),
            description: description.to_owned(),
            input_schema_json: schema.to_owned(),
            side_effect: side_effect as i32,
            commutative: false,
            requires_approval: false,
            timeout: Some(duration(timeout)),
        };
    vec![
        descriptor(
            LOOKUP,
            "Looks up a value by key in a small reference table (for example the key \
             \"profile\" or \"policy\"). Returns {\"key\", \"value\"}. Read-only: safe to \
             call again. An unknown key fails with NOT_FOUND; do not retry it unchanged.",
            LOOKUP_SCHEMA,
            SideEffect::ReadOnly,
            LOOKUP_TIMEOUT,
        ),
        descriptor(
            SLEEP,
            "Waits for the given number of milliseconds, then returns {\"slept_ms\"}. \
             Changes nothing; useful to test deadlines and cancellation.",
            SLEEP_SCHEMA,
            SideEffect::ReadOnly,
            SLEEP_TIMEOUT,
        ),
        descriptor(
            TRANSFER,
            "Moves a positive amount (in cents) from one account to another. This is a \
             real change: it is applied exactly once per effect key, and the result \
             carries a receipt identifying the transfer. Do not call it again to \"make \
             sure\"; a repeated call with the same effect key returns the first receipt.",
            TRANSFER_SCHEMA,
            SideEffect::Write,
            TRANSFER_TIMEOUT,
        ),
    ]
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// Arguments of `lookup`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LookupArgs {
    pub(crate) key: String,
}

/// Arguments of `sleep`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SleepArgs {
    pub(crate) ms: u64,
}

/// Arguments of `transfer`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TransferArgs {
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) amount: u64,
}

/// Parses arguments strictly; a failure is a structured error the model can act on
/// (fix the arguments), not a gRPC error.
pub(crate) fn parse_args<T: DeserializeOwned>(tool: &str, json: &str) -> Result<T, ToolError> {
    serde_json::from_str(json)
        .map_err(|e| invalid_arguments(format!("invalid arguments for {tool}: {e}")))
}

/// Checks the bounds serde cannot express.
pub(crate) fn check_transfer(args: &TransferArgs) -> Result<(), ToolError> {
    if args.amount == 0 {
        return Err(invalid_arguments("amount must be positive".to_owned()));
    }
    for (field, value) in [("from", &args.from), ("to", &args.to)] {
        if value.is_empty() || value.len() > MAX_ACCOUNT_BYTES {
            return Err(invalid_arguments(format!(
                "{field} must be 1 to {MAX_ACCOUNT_BYTES} bytes"
            )));
        }
    }
    // A business refusal, not a malformed call: the write is rejected, and the effect
    // ledger says so (the case an answer claiming "moved" must not get past).
    if args.from == args.to {
        return Err(tool_error(
            ErrorType::Rejected,
            "from and to are the same account: there is nothing to move".to_owned(),
            false,
            NextAction::Stop,
        ));
    }
    Ok(())
}

/// Checks the bounds serde cannot express.
pub(crate) fn check_sleep(args: &SleepArgs) -> Result<(), ToolError> {
    if args.ms > MAX_SLEEP_MS {
        return Err(invalid_arguments(format!(
            "ms must be at most {MAX_SLEEP_MS}"
        )));
    }
    Ok(())
}

/// A structured error with the given type and advice.
pub(crate) fn tool_error(
    error_type: ErrorType,
    message: String,
    retryable: bool,
    next: NextAction,
) -> ToolError {
    ToolError {
        error_type: error_type as i32,
        message,
        retryable,
        next_allowed_action: next as i32,
    }
}

fn invalid_arguments(message: String) -> ToolError {
    tool_error(
        ErrorType::InvalidArguments,
        message,
        false,
        NextAction::FixArguments,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn every_schema_is_a_json_object_and_every_tool_has_a_timeout() {
        let tools = descriptors();
        assert_eq!(
            tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            [LOOKUP, SLEEP, TRANSFER]
        );
        for tool in tools {
            let schema: serde_json::Value = serde_json::from_str(&tool.input_schema_json).unwrap();
            assert_eq!(schema["additionalProperties"], false, "{}", tool.name);
            assert!(tool.timeout.is_some_and(|t| t.seconds > 0), "{}", tool.name);
            assert!(!tool.description.is_empty());
        }
    }

    #[test]
    fn transfer_arguments_are_strict() {
        let extra =
            parse_args::<TransferArgs>(TRANSFER, r#"{"from":"a","to":"b","amount":1,"memo":"x"}"#);
        assert_eq!(
            extra.unwrap_err().error_type,
            ErrorType::InvalidArguments as i32
        );
        let same =
            parse_args::<TransferArgs>(TRANSFER, r#"{"from":"a","to":"a","amount":1}"#).unwrap();
        let refused = check_transfer(&same).unwrap_err();
        assert_eq!(refused.error_type(), ErrorType::Rejected);
        let negative = parse_args::<TransferArgs>(TRANSFER, r#"{"from":"a","to":"b","amount":-1}"#);
        assert!(negative.is_err());
        let zero =
            parse_args::<TransferArgs>(TRANSFER, r#"{"from":"a","to":"b","amount":0}"#).unwrap();
        assert!(check_transfer(&zero).is_err());
        let long = TransferArgs {
            from: "a".repeat(129),
            to: "b".into(),
            amount: 1,
        };
        assert!(check_transfer(&long).is_err());
        let sleep = parse_args::<SleepArgs>(SLEEP, r#"{"ms":600001}"#).unwrap();
        assert!(check_sleep(&sleep).is_err());
    }
}
