//! Final-answer validators: an answer is a claim until these accept it.

use agentloop_proto::v1::{ValidateFinalRequest, ValidateFinalResponse};
use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use crate::tools::check_invocation_id;

/// Most `evidence_refs` one request may carry; more is INVALID_ARGUMENT.
pub const MAX_EVIDENCE_REFS: usize = 1024;

/// The validators of the default profile. `non_empty` always runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FinalValidators {
    /// Largest accepted answer, in bytes (default 64 KiB).
    pub max_answer_bytes: usize,
    /// Refuse an answer that cites no evidence (`evidence_refs` empty): "no evidence,
    /// no success". Off by default, because a plain question needs no tool.
    pub require_evidence: bool,
}

impl Default for FinalValidators {
    fn default() -> Self {
        FinalValidators {
            max_answer_bytes: 64 * 1024,
            require_evidence: false,
        }
    }
}

impl FinalValidators {
    /// Runs every validator and lists each failure (the model sees them all in its one
    /// repair turn). `profile` and `goal` are not used yet.
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidRequest`] for a missing `invocation_id` or more than
    /// [`MAX_EVIDENCE_REFS`] evidence references.
    pub fn validate(
        &self,
        request: &ValidateFinalRequest,
    ) -> Result<ValidateFinalResponse, PolicyError> {
        check_invocation_id(&request.invocation_id)?;
        if request.evidence_refs.len() > MAX_EVIDENCE_REFS {
            return Err(PolicyError::InvalidRequest(format!(
                "{} evidence_refs; at most {MAX_EVIDENCE_REFS} are allowed",
                request.evidence_refs.len()
            )));
        }
        let mut reasons = Vec::new();
        if request.answer.trim().is_empty() {
            reasons.push("non_empty: the answer is empty".to_owned());
        }
        if request.answer.len() > self.max_answer_bytes {
            reasons.push(format!(
                "max_answer_bytes: the answer is {} bytes; at most {} are allowed",
                request.answer.len(),
                self.max_answer_bytes
            ));
        }
        if self.require_evidence && request.evidence_refs.iter().all(|r| r.trim().is_empty()) {
            reasons.push(
                "require_evidence: the answer cites no evidence (evidence_refs is empty); no evidence, no success"
                    .to_owned(),
            );
        }
        Ok(ValidateFinalResponse {
            accepted: reasons.is_empty(),
            reasons,
        })
    }
}
