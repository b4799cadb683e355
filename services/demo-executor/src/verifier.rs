//! The `transfer_recorded` verifier: "each transfer this invocation committed exists in
//! my record, as claimed".
//!
//! The orchestrator's effect ledger says which writes it believes were committed, and
//! the log holds the results the answer cites; only the executor that owns the data can
//! say whether those transfers really happened. So the verifier checks the claim
//! against the same durable record that dedupes effect keys ([`crate::record`]), as an
//! [`agentloop_executor::Verifier`]:
//!
//! - every effect of `transfer` the ledger lists as COMMITTED must be recorded under its
//!   effect key, with the ledger's receipt, for this invocation;
//! - every cited `transfer` result with an output must carry a receipt that is recorded,
//!   for this invocation, as the transfer the call's arguments asked for.
//!
//! All found: ACCEPTED, with the receipts as evidence. Any missing or different:
//! REJECTED, one reason per transfer, written so the model can correct its answer. A
//! claim that rests on no committed transfer at all is REJECTED too ("no committed
//! transfer to confirm"): a profile names this verifier because its answers report a
//! transfer, so an answer without one is not backed, and accepting it would let a
//! model claim a transfer it never made. A record in doubt (a failed rollback) is
//! UNDECIDED: it can promise neither.
//!
//! Tenancy: the demo's record has no tenants (one demo tenant, every account in one
//! table), so `claim.tenant` is not consulted. A real verifier must look only at the
//! claim's tenant's data.
//!
//! Bounds: [`Verdict::into_response`] keeps the answer to the gateway's (at most 32
//! reasons, 64 evidence references). Quoted keys and receipts are cut to 256 bytes, so
//! every reason stays short.

use std::collections::HashSet;

use agentloop_executor::{AppliedEffect, Record, RecordError, Verdict, Verifier};
use agentloop_proto::v1::tool_result::Outcome;
use agentloop_proto::v1::{Claim, EffectState, ToolOutput};

use crate::record::AppliedTransfer;
use crate::tools::{TRANSFER, TRANSFER_RECORDED, TransferArgs};

/// Longest key, receipt or call ID quoted in a reason, in bytes.
const MAX_QUOTED_BYTES: usize = 256;

/// The verifier, over the executor's record.
#[derive(Debug)]
pub(crate) struct TransferRecorded {
    record: Record,
}

impl TransferRecorded {
    pub(crate) fn new(record: Record) -> TransferRecorded {
        TransferRecorded { record }
    }
}

impl Verifier for TransferRecorded {
    const NAME: &'static str = TRANSFER_RECORDED;
    const DESCRIPTION: &'static str = "Confirms that every transfer the invocation committed, \
        and every transfer receipt the answer cites, is in the demo executor's record as \
        claimed.";

    async fn verify(&self, claim: Claim) -> Verdict {
        transfer_recorded(&self.record, &claim)
    }
}

/// A record lookup as a transfer, or why the record cannot tell.
fn transfer(
    found: Result<Option<AppliedEffect>, RecordError>,
) -> Result<Option<AppliedTransfer>, String> {
    found
        .map_err(|e| e.to_string())?
        .map(AppliedTransfer::from_effect)
        .transpose()
}

/// Judges `claim` against `record`.
pub(crate) fn transfer_recorded(record: &Record, claim: &Claim) -> Verdict {
    let mut judged = Judged::default();
    let committed = claim
        .effects
        .iter()
        .filter(|effect| effect.tool == TRANSFER && effect.state == EffectState::Committed as i32);
    for effect in committed {
        judged.considered += 1;
        let key = quote(&effect.effect_key);
        match transfer(record.get(TRANSFER, &effect.effect_key)) {
            Err(reason) => return in_doubt(&reason),
            Ok(None) => judged.problems.push(format!(
                "transfer {key} is committed in the ledger but is not in the executor's record: \
                 it never happened"
            )),
            Ok(Some(entry)) if entry.receipt != effect.receipt => {
                judged.problems.push(format!(
                    "transfer {key}: the ledger's receipt {} is not the recorded one ({})",
                    quote(&effect.receipt),
                    quote(&entry.receipt)
                ));
            }
            Ok(Some(entry)) => judged.confirm(&entry, claim, &key),
        }
    }
    for cited in claim.cited.iter().filter(|cited| cited.tool == TRANSFER) {
        let Some(Outcome::Output(ToolOutput {
            receipt,
            output_json,
        })) = cited
            .result
            .as_ref()
            .and_then(|result| result.outcome.as_ref())
        else {
            // A failed or unknown transfer claims no transfer; the ledger covers it.
            continue;
        };
        // The event log keeps a result's output, not its receipt (the ledger has that),
        // and this executor's output names the receipt too.
        let receipt = if receipt.is_empty() {
            &receipt_in(output_json)
        } else {
            receipt
        };
        judged.considered += 1;
        let call = quote(&cited.call_id);
        match transfer(record.get_by_receipt(TRANSFER, receipt)) {
            Err(reason) => return in_doubt(&reason),
            Ok(None) => judged.problems.push(format!(
                "call {call} cites receipt {}, which is not in the executor's record",
                quote(receipt)
            )),
            Ok(Some(entry)) if !asked_for(&entry, &cited.arguments_json) => {
                judged.problems.push(format!(
                    "call {call}: receipt {} records a transfer of {} from {} to {}, not the one \
                     the call asked for",
                    quote(receipt),
                    entry.amount,
                    quote(&entry.from),
                    quote(&entry.to)
                ));
            }
            Ok(Some(entry)) => judged.confirm(&entry, claim, &format!("call {call}")),
        }
    }
    judged.verdict()
}

/// The `receipt` an output of this executor's `transfer` names; empty when none.
fn receipt_in(output_json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(output_json)
        .ok()
        .and_then(|output| output.get("receipt")?.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// What the checks found so far.
#[derive(Debug, Default)]
struct Judged {
    /// Transfers the claim rests on (committed effects and cited outputs).
    considered: usize,
    problems: Vec<String>,
    /// Receipts confirmed, in the order found, each once.
    receipts: Vec<String>,
    seen: HashSet<String>,
}

impl Judged {
    /// `entry` is what `what` names; it only counts for the invocation that made it.
    fn confirm(&mut self, entry: &AppliedTransfer, claim: &Claim, what: &str) {
        if entry.invocation_id != claim.invocation_id {
            self.problems.push(format!(
                "{what}: receipt {} was recorded for another invocation",
                quote(&entry.receipt)
            ));
            return;
        }
        if self.seen.insert(entry.receipt.clone()) {
            self.receipts.push(entry.receipt.clone());
        }
    }

    fn verdict(self) -> Verdict {
        if self.considered == 0 {
            return Verdict::Rejected {
                reasons: vec!["no committed transfer to confirm".to_owned()],
                evidence: Vec::new(),
            };
        }
        if self.problems.is_empty() {
            return Verdict::Accepted {
                evidence: self.receipts,
            };
        }
        Verdict::Rejected {
            reasons: self.problems,
            // The transfers that did check out: what the rejection does not dispute.
            evidence: self.receipts,
        }
    }
}

/// Whether the call's arguments ask for the transfer `entry` records. Arguments that do
/// not parse ask for no transfer at all.
fn asked_for(entry: &AppliedTransfer, arguments_json: &str) -> bool {
    serde_json::from_str::<TransferArgs>(arguments_json).is_ok_and(|args| {
        args.from == entry.from && args.to == entry.to && args.amount == entry.amount
    })
}

fn in_doubt(reason: &str) -> Verdict {
    Verdict::undecided(format!(
        "the executor's record is in doubt and can confirm nothing: {}",
        agentloop_proto::prefix(reason, 1024)
    ))
}

/// `text` in quotes, cut to [`MAX_QUOTED_BYTES`]: the claim's keys are not bounded by
/// this executor, and a reason must stay short.
fn quote(text: &str) -> String {
    format!("{:?}", agentloop_proto::prefix(text, MAX_QUOTED_BYTES))
}

#[cfg(test)]
mod tests {

    use agentloop_proto::MAX_VERIFIER_REASONS;
    use agentloop_proto::v1::{
        CheckVerdict, CitedResult, EffectEntry, ToolExecutorServiceVerifyResponse, ToolResult,
    };

    use super::*;

    const ARGS: &str = r#"{"from":"alice","to":"bob","amount":5}"#;

    fn record(dir: &std::path::Path, keys: &[&str]) -> Record {
        let record = Record::open(dir).unwrap();
        for (n, key) in keys.iter().enumerate() {
            record
                .append(AppliedEffect {
                    tool: TRANSFER.into(),
                    effect_key: (*key).to_owned(),
                    invocation_id: "inv".into(),
                    call_id: "c1".into(),
                    attempt: 1,
                    arguments_json: ARGS.into(),
                    receipt: format!("txn-{:08}", n + 1),
                    output_json: "{}".into(),
                })
                .unwrap();
        }
        record
    }

    fn judge(record: &Record, claim: &Claim) -> ToolExecutorServiceVerifyResponse {
        transfer_recorded(record, claim).into_response()
    }

    fn committed(key: &str, receipt: &str) -> EffectEntry {
        EffectEntry {
            invocation_id: "inv".into(),
            effect_key: key.into(),
            tool: TRANSFER.into(),
            state: EffectState::Committed as i32,
            receipt: receipt.into(),
            ..EffectEntry::default()
        }
    }

    fn cited(call_id: &str, args: &str, receipt: &str) -> CitedResult {
        CitedResult {
            call_id: call_id.into(),
            turn: 1,
            tool: TRANSFER.into(),
            arguments_json: args.into(),
            result: Some(ToolResult {
                call_id: call_id.into(),
                outcome: Some(Outcome::Output(ToolOutput {
                    output_json: "{}".into(),
                    receipt: receipt.into(),
                })),
            }),
        }
    }

    fn claim(effects: Vec<EffectEntry>, cited: Vec<CitedResult>) -> Claim {
        Claim {
            invocation_id: "inv".into(),
            effects,
            cited,
            ..Claim::default()
        }
    }

    #[test]
    fn recorded_transfers_are_accepted_with_their_receipts_once() {
        let dir = tempfile::tempdir().unwrap();
        let record = record(dir.path(), &["k1", "k2"]);
        let verdict = judge(
            &record,
            &claim(
                vec![
                    committed("k1", "txn-00000001"),
                    committed("k2", "txn-00000002"),
                ],
                vec![cited("c1", ARGS, "txn-00000001")],
            ),
        );
        assert_eq!(verdict.verdict(), CheckVerdict::Accepted, "{verdict:?}");
        assert_eq!(verdict.evidence, ["txn-00000001", "txn-00000002"]);
    }

    #[test]
    fn each_unconfirmed_transfer_is_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let record = record(dir.path(), &["k1"]);
        let other_tool = EffectEntry {
            tool: "refund".into(),
            ..committed("zzz", "")
        };
        let prepared = EffectEntry {
            state: EffectState::Prepared as i32,
            ..committed("k9", "")
        };
        let verdict = judge(
            &record,
            &claim(
                vec![
                    committed("k1", "txn-00000001"),
                    committed("k9", "txn-00000009"),
                    committed("k1", "txn-00000002"),
                    other_tool,
                    prepared,
                ],
                vec![
                    cited("c2", ARGS, "txn-00000042"),
                    cited(
                        "c3",
                        r#"{"from":"alice","to":"eve","amount":5}"#,
                        "txn-00000001",
                    ),
                ],
            ),
        );
        assert_eq!(verdict.verdict(), CheckVerdict::Rejected);
        assert_eq!(verdict.reasons.len(), 4, "{verdict:?}");
        assert!(verdict.reasons[0].contains("\"k9\""));
        assert!(verdict.reasons[1].contains("is not the recorded one"));
        assert!(verdict.reasons[2].contains("\"txn-00000042\""));
        assert!(verdict.reasons[3].contains("not the one the call asked for"));
        assert_eq!(verdict.evidence, ["txn-00000001"]);
    }

    #[test]
    fn another_invocations_transfer_is_not_this_ones() {
        let dir = tempfile::tempdir().unwrap();
        let record = record(dir.path(), &["k1"]);
        let mut other = claim(vec![committed("k1", "txn-00000001")], vec![]);
        other.invocation_id = "inv-2".into();
        let verdict = judge(&record, &other);
        assert_eq!(verdict.verdict(), CheckVerdict::Rejected);
        assert!(
            verdict.reasons[0].contains("another invocation"),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_claim_without_transfers_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let record = record(dir.path(), &["k1"]);
        let mut failed = cited("c1", ARGS, "");
        failed.result = Some(ToolResult {
            call_id: "c1".into(),
            outcome: None,
        });
        let verdict = judge(&record, &claim(vec![], vec![failed]));
        assert_eq!(verdict.verdict(), CheckVerdict::Rejected);
        assert_eq!(verdict.reasons, ["no committed transfer to confirm"]);
    }

    #[test]
    fn reasons_stay_within_the_gateways_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let record = record(dir.path(), &[]);
        let long = "k".repeat(10_000);
        let effects = (0..100)
            .map(|i| committed(&format!("{long}{i}"), "txn"))
            .collect();
        let verdict = judge(&record, &claim(effects, vec![]));
        assert_eq!(verdict.verdict(), CheckVerdict::Rejected);
        assert_eq!(verdict.reasons.len(), MAX_VERIFIER_REASONS);
        assert!(verdict.reasons.iter().all(|r| r.len() < 2048));
        assert!(verdict.reasons[MAX_VERIFIER_REASONS - 1].contains("69 more"));
    }
}
