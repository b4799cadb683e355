//! [`Verifier`]: an executor's optional judge of final answers (the `Verify` RPC), and
//! its [`Verdict`].
//!
//! A profile names verifiers to have a final answer checked against the systems it
//! claims to have changed: only the executor that owns the data can say whether a
//! write really happened. A verifier reads the same [record](crate::Record) that
//! dedupes effect keys, or the tool's own data.

use std::future::Future;
use std::time::Duration;

use agentloop_proto::v1::{CheckVerdict, Claim, ToolExecutorServiceVerifyResponse};
use agentloop_proto::{
    MAX_VERIFIER_EVIDENCE, MAX_VERIFIER_EVIDENCE_BYTES, MAX_VERIFIER_REASON_BYTES,
    MAX_VERIFIER_REASONS,
};

/// One verifier: its name and description as constants (what `Describe` reports), and
/// the judgement.
pub trait Verifier: Send + Sync + 'static {
    /// Unique name among the executor's verifiers, as profiles name it:
    /// `[a-zA-Z0-9_.-]{1,64}`.
    const NAME: &'static str;
    /// What it confirms, for operators and the checks a final answer lists.
    const DESCRIPTION: &'static str;
    /// The longest one verification may take, 1 ms to 10 minutes; past it the executor
    /// answers UNDECIDED (which fails closed).
    const TIMEOUT: Duration = Duration::from_secs(10);

    /// Judges `claim`: the answer, its citations, the cited results and the
    /// invocation's effects. A verifier that cannot tell (its data is unreachable or in
    /// doubt) answers [`Verdict::Undecided`], never a guess.
    fn verify(&self, claim: Claim) -> impl Future<Output = Verdict> + Send;
}

/// A verifier's judgement. [`Verdict::into_response`] keeps it within the gateway's
/// bounds, so a verifier may give as many reasons as it finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The claim holds.
    Accepted {
        /// What it rests on in the executor's records (receipts, record IDs).
        evidence: Vec<String>,
    },
    /// The claim does not hold.
    Rejected {
        /// Why, written for the model, which may repair its answer once.
        reasons: Vec<String>,
        /// What did check out.
        evidence: Vec<String>,
    },
    /// The verifier cannot tell; fails closed.
    Undecided {
        /// Why.
        reasons: Vec<String>,
    },
}

impl Verdict {
    /// An undecided verdict with one reason.
    pub fn undecided(reason: impl Into<String>) -> Verdict {
        Verdict::Undecided {
            reasons: vec![reason.into()],
        }
    }

    /// The wire answer, bounded: at most [`MAX_VERIFIER_REASONS`] reasons (the ones past
    /// the last but one are counted in the last) of at most [`MAX_VERIFIER_REASON_BYTES`]
    /// each, and the first [`MAX_VERIFIER_EVIDENCE`] evidence references that fit in
    /// [`MAX_VERIFIER_EVIDENCE_BYTES`] (a reference is dropped, not cut: a cut one would
    /// name something else).
    pub fn into_response(self) -> ToolExecutorServiceVerifyResponse {
        let (verdict, reasons, evidence) = match self {
            Verdict::Accepted { evidence } => (CheckVerdict::Accepted, Vec::new(), evidence),
            Verdict::Rejected { reasons, evidence } => (CheckVerdict::Rejected, reasons, evidence),
            Verdict::Undecided { reasons } => (CheckVerdict::Undecided, reasons, Vec::new()),
        };
        ToolExecutorServiceVerifyResponse {
            verdict: verdict as i32,
            reasons: bounded_reasons(reasons),
            evidence: evidence
                .into_iter()
                .filter(|reference| reference.len() <= MAX_VERIFIER_EVIDENCE_BYTES)
                .take(MAX_VERIFIER_EVIDENCE)
                .collect(),
        }
    }
}

fn bounded_reasons(mut reasons: Vec<String>) -> Vec<String> {
    if reasons.len() > MAX_VERIFIER_REASONS {
        let more = reasons.len() - (MAX_VERIFIER_REASONS - 1);
        reasons.truncate(MAX_VERIFIER_REASONS - 1);
        reasons.push(format!("and {more} more reasons"));
    }
    for reason in &mut reasons {
        let end = agentloop_proto::prefix(reason, MAX_VERIFIER_REASON_BYTES).len();
        reason.truncate(end);
    }
    reasons
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn verdicts_keep_to_the_gateways_bounds() {
        let reasons = (0..100)
            .map(|i| format!("{i}{}", "x".repeat(5000)))
            .collect();
        let mut evidence: Vec<String> = (0..100).map(|i| format!("r{i}")).collect();
        evidence.insert(0, "y".repeat(MAX_VERIFIER_EVIDENCE_BYTES + 1));
        let response = Verdict::Rejected { reasons, evidence }.into_response();
        assert_eq!(response.verdict(), CheckVerdict::Rejected);
        assert_eq!(response.reasons.len(), MAX_VERIFIER_REASONS);
        assert!(
            response
                .reasons
                .iter()
                .all(|r| r.len() <= MAX_VERIFIER_REASON_BYTES)
        );
        assert_eq!(
            response.reasons[MAX_VERIFIER_REASONS - 1],
            "and 69 more reasons"
        );
        assert_eq!(response.evidence.len(), MAX_VERIFIER_EVIDENCE);
        assert_eq!(response.evidence[0], "r0");

        let undecided = Verdict::undecided("in doubt").into_response();
        assert_eq!(undecided.verdict(), CheckVerdict::Undecided);
        assert_eq!(undecided.reasons, ["in doubt"]);
        let accepted = Verdict::Accepted {
            evidence: vec!["r1".into()],
        }
        .into_response();
        assert_eq!(
            (accepted.verdict(), accepted.evidence),
            (CheckVerdict::Accepted, vec!["r1".to_owned()])
        );
    }
}
