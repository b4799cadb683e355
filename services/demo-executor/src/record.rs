//! The transfers in the executor's record: what tests, chaos checks and the
//! `transfer_recorded` verifier read.
//!
//! The record itself is `agentloop-executor`'s ([`agentloop_executor::Record`]): an
//! append-only file of JSON lines in the data directory, appended and `fsync`ed before a
//! transfer is acknowledged, which dedupes effect keys and answers `Reconcile`. This
//! module reads its `transfer` entries as [`AppliedTransfer`]s, the accounts and the
//! amount taken from the recorded arguments.

use std::path::Path;

use agentloop_executor::{AppliedEffect, Record, RecordError};

use crate::DemoError;
use crate::tools::{TRANSFER, TransferArgs};

pub use agentloop_executor::RECORD_FILE_NAME;

/// File name of the record before the demo executor was built on `agentloop-executor`
/// (one line per transfer, in another format). It is not read: an executor that finds
/// one refuses to start rather than forget the transfers in it.
pub const LEGACY_RECORD_FILE_NAME: &str = "transfers.jsonl";

/// One applied transfer, as the record holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedTransfer {
    /// The effect key the transfer was applied under; unique in the record.
    pub effect_key: String,
    /// The invocation that asked for it.
    pub invocation_id: String,
    /// The call that asked for it.
    pub call_id: String,
    /// The dispatch attempt that applied it.
    pub attempt: u32,
    /// Source account.
    pub from: String,
    /// Destination account.
    pub to: String,
    /// Amount moved, in minor units.
    pub amount: u64,
    /// The executor's identifier of the change, returned as the call's receipt.
    pub receipt: String,
    /// The call's output as JSON text, returned again on a duplicate and by Reconcile.
    pub output_json: String,
}

impl AppliedTransfer {
    /// The transfer `effect` records (an entry of `transfer`), or why its arguments do
    /// not read as a transfer.
    pub(crate) fn from_effect(effect: AppliedEffect) -> Result<AppliedTransfer, String> {
        let args: TransferArgs = serde_json::from_str(&effect.arguments_json)
            .map_err(|e| format!("the recorded arguments are not a transfer: {e}"))?;
        Ok(AppliedTransfer {
            effect_key: effect.effect_key,
            invocation_id: effect.invocation_id,
            call_id: effect.call_id,
            attempt: effect.attempt,
            from: args.from,
            to: args.to,
            amount: args.amount,
            receipt: effect.receipt,
            output_json: effect.output_json,
        })
    }
}

/// Reads the applied transfers of the record in `data_dir` without opening it for
/// writing (a torn tail is skipped, not cut off). For tests and chaos checks that
/// compare what clients were told with the ground truth.
///
/// # Errors
///
/// [`DemoError::Record`] if the file cannot be read (a missing file is an empty record)
/// or a complete line is damaged.
pub fn read_record(data_dir: &Path) -> Result<Vec<AppliedTransfer>, DemoError> {
    Record::read(data_dir)?
        .into_iter()
        .enumerate()
        .filter(|(_, effect)| effect.tool == TRANSFER)
        .map(|(index, effect)| {
            AppliedTransfer::from_effect(effect).map_err(|reason| {
                DemoError::Record(RecordError::Corrupt {
                    path: data_dir.join(RECORD_FILE_NAME),
                    line: index + 1,
                    reason,
                })
            })
        })
        .collect()
}

/// Opens the record in `data_dir` (creating it), refusing a directory that still holds
/// a record of the old format.
pub(crate) fn open(data_dir: &Path) -> Result<Record, DemoError> {
    let legacy = data_dir.join(LEGACY_RECORD_FILE_NAME);
    if legacy.exists() {
        return Err(DemoError::LegacyRecord { path: legacy });
    }
    Ok(Record::open(data_dir)?)
}
