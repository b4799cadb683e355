//! How a verifier's answer, or its failure to give one, becomes the one [`Check`] the
//! gateway returns for it.
//!
//! A verifier guards the end of an invocation: the answer is accepted only when every
//! verifier accepts it. So every way of *not* hearing a clear answer fails closed, as
//! an UNDECIDED check with one reason saying what happened, never as an error status
//! the caller might handle more leniently:
//!
//! - the executor could not be reached, was busy until the deadline, or ran out of time;
//! - it answered with an error status (UNIMPLEMENTED from an executor that serves no
//!   verifier included);
//! - it answered without a verdict (UNSPECIFIED, or a value this build does not know);
//! - it answered beyond the bounds below. The whole answer is then UNDECIDED rather
//!   than truncated: a cut list of reasons may drop the one that matters, and a
//!   verifier that breaks the contract should be noticed and fixed, not papered over.
//!
//! Kept as pure functions, like [`crate::outcome`], so every case is tested without a
//! network.

use std::time::Duration;

use agentloop_proto::v1::{Check, CheckKind, CheckVerdict, ToolExecutorServiceVerifyResponse};
use tonic::Code;

use crate::outcome::CallFailure;

pub use agentloop_proto::{
    MAX_VERIFIER_EVIDENCE, MAX_VERIFIER_EVIDENCE_BYTES, MAX_VERIFIER_REASON_BYTES,
    MAX_VERIFIER_REASONS,
};

/// The check of a verifier whose executor answered.
pub fn answered(verifier: &str, reply: ToolExecutorServiceVerifyResponse) -> Check {
    let verdict = match CheckVerdict::try_from(reply.verdict) {
        Ok(
            verdict @ (CheckVerdict::Accepted | CheckVerdict::Rejected | CheckVerdict::Undecided),
        ) => verdict,
        Ok(CheckVerdict::Unspecified) | Err(_) => {
            return malformed(verifier, "no verdict".to_owned());
        }
    };
    if let Some(excess) = beyond_bounds(&reply) {
        return malformed(verifier, format!("answered beyond bounds: {excess}"));
    }
    let mut reasons: Vec<String> = reply
        .reasons
        .into_iter()
        .filter(|reason| !reason.trim().is_empty())
        .collect();
    // The model must always hear why its answer was not accepted.
    if reasons.is_empty() {
        match verdict {
            CheckVerdict::Rejected => reasons.push(format!(
                "verifier {verifier} rejected the answer without giving a reason"
            )),
            CheckVerdict::Undecided => reasons.push(format!(
                "verifier {verifier} could not decide and gave no reason"
            )),
            CheckVerdict::Accepted | CheckVerdict::Unspecified => {}
        }
    }
    Check {
        name: verifier.to_owned(),
        kind: CheckKind::Verifier as i32,
        verdict: verdict as i32,
        reasons,
        evidence: reply.evidence,
    }
}

/// The check of a verifier whose executor gave no answer: UNDECIDED, saying why.
/// `timeout` is the one the call ran under, for the reason of a timeout.
pub fn unanswered(verifier: &str, timeout: Duration, failure: &CallFailure) -> Check {
    undecided(verifier, failure_reason(verifier, timeout, failure))
}

/// The check of a verifier whose reply breaks the contract: undecided, saying how.
fn malformed(verifier: &str, detail: String) -> Check {
    let failure = CallFailure::MalformedReply { detail };
    undecided(verifier, failure_reason(verifier, Duration::ZERO, &failure))
}

fn undecided(verifier: &str, reason: String) -> Check {
    Check {
        name: verifier.to_owned(),
        kind: CheckKind::Verifier as i32,
        verdict: CheckVerdict::Undecided as i32,
        reasons: vec![truncate(reason, MAX_VERIFIER_REASON_BYTES)],
        evidence: Vec::new(),
    }
}

/// What happened, in words for the model and the operator.
fn failure_reason(verifier: &str, timeout: Duration, failure: &CallFailure) -> String {
    match failure {
        CallFailure::NotSent { detail } | CallFailure::Unreachable { detail } => {
            format!("verifier {verifier} could not be reached: {detail}")
        }
        CallFailure::DeadlineExceeded
        | CallFailure::Status {
            code: Code::DeadlineExceeded,
            ..
        } => format!(
            "verifier {verifier} timed out after {} ms",
            timeout.as_millis()
        ),
        CallFailure::Status {
            code: Code::Unimplemented,
            message,
        } => {
            format!("verifier {verifier} is not served by its executor (UNIMPLEMENTED: {message})")
        }
        CallFailure::Status { code, message } => {
            format!("verifier {verifier} failed: executor status {code:?}: {message}")
        }
        CallFailure::MalformedReply { detail } => {
            format!("verifier {verifier} gave no usable answer: {detail}")
        }
    }
}

/// The first bound the reply breaks, if any.
fn beyond_bounds(reply: &ToolExecutorServiceVerifyResponse) -> Option<String> {
    beyond(
        &reply.reasons,
        ("reasons", "a reason"),
        MAX_VERIFIER_REASONS,
        MAX_VERIFIER_REASON_BYTES,
    )
    .or_else(|| {
        beyond(
            &reply.evidence,
            ("evidence references", "an evidence reference"),
            MAX_VERIFIER_EVIDENCE,
            MAX_VERIFIER_EVIDENCE_BYTES,
        )
    })
}

/// The bound `items` break, if any: more than `most` of them, or one longer than
/// `longest` bytes; `(many, one)` name them in the message.
fn beyond(
    items: &[String],
    (many, one): (&str, &str),
    most: usize,
    longest: usize,
) -> Option<String> {
    if items.len() > most {
        return Some(format!("{} {many} (at most {most})", items.len()));
    }
    let long = items.iter().find(|item| item.len() > longest)?;
    Some(format!("{one} of {} bytes (at most {longest})", long.len()))
}

/// `text` cut to at most `max` bytes, at a character boundary; the executor's status
/// message is quoted in a reason and may be of any length.
fn truncate(mut text: String, max: usize) -> String {
    let end = agentloop_proto::prefix(&text, max).len();
    text.truncate(end);
    text
}

#[cfg(test)]
mod tests {

    use super::*;

    fn reply(
        verdict: CheckVerdict,
        reasons: &[&str],
        evidence: &[&str],
    ) -> ToolExecutorServiceVerifyResponse {
        ToolExecutorServiceVerifyResponse {
            verdict: verdict as i32,
            reasons: reasons.iter().map(|r| (*r).to_owned()).collect(),
            evidence: evidence.iter().map(|e| (*e).to_owned()).collect(),
        }
    }

    fn only_reason(check: &Check) -> &str {
        assert_eq!(check.reasons.len(), 1, "{check:?}");
        &check.reasons[0]
    }

    #[test]
    fn a_clear_answer_passes_through_named_after_the_verifier() {
        let accepted = answered("v", reply(CheckVerdict::Accepted, &[], &["txn-1"]));
        assert_eq!(accepted.name, "v");
        assert_eq!(accepted.kind(), CheckKind::Verifier);
        assert_eq!(accepted.verdict(), CheckVerdict::Accepted);
        assert!(accepted.reasons.is_empty());
        assert_eq!(accepted.evidence, ["txn-1"]);

        let rejected = answered("v", reply(CheckVerdict::Rejected, &["a", "b"], &[]));
        assert_eq!(rejected.verdict(), CheckVerdict::Rejected);
        assert_eq!(rejected.reasons, ["a", "b"]);
    }

    #[test]
    fn a_verdict_without_a_reason_gets_one() {
        let rejected = answered("v", reply(CheckVerdict::Rejected, &[" ", ""], &[]));
        assert_eq!(rejected.verdict(), CheckVerdict::Rejected);
        assert!(only_reason(&rejected).contains("without giving a reason"));
        let undecided = answered("v", reply(CheckVerdict::Undecided, &[], &[]));
        assert_eq!(undecided.verdict(), CheckVerdict::Undecided);
        assert!(only_reason(&undecided).contains("gave no reason"));
    }

    #[test]
    fn no_verdict_is_undecided() {
        for verdict in [CheckVerdict::Unspecified as i32, 99] {
            let check = answered(
                "v",
                ToolExecutorServiceVerifyResponse {
                    verdict,
                    reasons: vec![],
                    evidence: vec!["txn-1".into()],
                },
            );
            assert_eq!(check.verdict(), CheckVerdict::Undecided);
            assert!(only_reason(&check).contains("no verdict"), "{check:?}");
            assert!(check.evidence.is_empty());
        }
    }

    #[test]
    fn an_answer_beyond_bounds_is_undecided() {
        let many: Vec<String> = (0..=MAX_VERIFIER_REASONS).map(|i| i.to_string()).collect();
        let long_reason = "r".repeat(MAX_VERIFIER_REASON_BYTES + 1);
        let much: Vec<String> = (0..=MAX_VERIFIER_EVIDENCE).map(|i| i.to_string()).collect();
        let long_ref = "e".repeat(MAX_VERIFIER_EVIDENCE_BYTES + 1);
        let cases = [
            (many.clone(), vec![]),
            (vec![long_reason], vec![]),
            (vec![], much),
            (vec![], vec![long_ref]),
        ];
        for (reasons, evidence) in cases {
            let check = answered(
                "v",
                ToolExecutorServiceVerifyResponse {
                    verdict: CheckVerdict::Accepted as i32,
                    reasons,
                    evidence,
                },
            );
            assert_eq!(check.verdict(), CheckVerdict::Undecided);
            assert!(only_reason(&check).contains("beyond bounds"), "{check:?}");
        }
        // At the bounds is fine.
        let at: Vec<String> = many.into_iter().take(MAX_VERIFIER_REASONS).collect();
        let check = answered(
            "v",
            ToolExecutorServiceVerifyResponse {
                verdict: CheckVerdict::Rejected as i32,
                reasons: at,
                evidence: vec!["e".repeat(MAX_VERIFIER_EVIDENCE_BYTES); MAX_VERIFIER_EVIDENCE],
            },
        );
        assert_eq!(check.verdict(), CheckVerdict::Rejected);
    }

    #[test]
    fn every_failure_is_undecided_and_says_what_happened() {
        let timeout = Duration::from_millis(5000);
        let cases = [
            (
                CallFailure::DeadlineExceeded,
                "verifier transfer_recorded timed out after 5000 ms",
            ),
            (
                CallFailure::Status {
                    code: Code::DeadlineExceeded,
                    message: "late".into(),
                },
                "timed out after 5000 ms",
            ),
            (
                CallFailure::NotSent {
                    detail: "connection refused".into(),
                },
                "could not be reached: connection refused",
            ),
            (
                CallFailure::Status {
                    code: Code::Unimplemented,
                    message: "no".into(),
                },
                "not served by its executor",
            ),
            (
                CallFailure::Status {
                    code: Code::Internal,
                    message: "disk".into(),
                },
                "executor status Internal: disk",
            ),
        ];
        for (failure, expected) in cases {
            let check = unanswered("transfer_recorded", timeout, &failure);
            assert_eq!(check.name, "transfer_recorded");
            assert_eq!(check.kind(), CheckKind::Verifier);
            assert_eq!(check.verdict(), CheckVerdict::Undecided);
            assert!(only_reason(&check).contains(expected), "{check:?}");
        }
    }

    #[test]
    fn a_long_status_message_is_cut_at_a_character_boundary() {
        let check = unanswered(
            "v",
            Duration::from_secs(1),
            &CallFailure::Status {
                code: Code::Internal,
                message: "é".repeat(MAX_VERIFIER_REASON_BYTES),
            },
        );
        assert!(only_reason(&check).len() <= MAX_VERIFIER_REASON_BYTES);
    }
}
