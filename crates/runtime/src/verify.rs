//! Verification of a final answer: the runner gathers the committed state the answer is
//! checked against (the results it cites, from the log; the invocation's writes, from
//! the effect ledger), has policy run the profile's acceptance rules on it, and then has
//! each of the profile's verifiers judge it. Whatever cannot be asked or read fails
//! closed: the answer is not accepted, and the model hears why in its repair turn.
//!
//! It runs as one of the runner's operations, so a cancel, a lost lease or the deadline
//! drops it, and the RPCs in flight with it.

use std::sync::Arc;
use std::time::Duration;

use agentloop_engine::{
    Check, CheckKind, CheckVerdict, MAX_CLAIM_EFFECTS, MAX_PROFILE_VERIFIERS, Verification,
};
use futures::future::join_all;
use uuid::Uuid;

use crate::Shared;
use crate::context::{cite, read_log};
use crate::ports::{Claim, Effect, LedgerPort};

/// Ledger entries asked for per page.
const LEDGER_PAGE: u32 = 256;

/// One answer to verify, and where to look for what it cites.
pub(crate) struct Verify {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: Uuid,
    pub(crate) profile: String,
    /// The answer and its citations, with the cited results the runner's window holds.
    pub(crate) claim: Claim,
    /// Set when some citations are not in the window: the log's events before this seq
    /// are read for them.
    pub(crate) older: Option<u64>,
    /// Whether a batch with writes started in the invocation: only then can the ledger
    /// have entries for it, and only then is it asked.
    pub(crate) writes: bool,
    /// How long the verifiers may take, at most: the time left to the deadline.
    pub(crate) within: Option<Duration>,
}

impl Verify {
    pub(crate) async fn run(mut self) -> Verification {
        if let Some(before) = self.older
            && let Err(why) = self.cite_older(before).await
        {
            return closed(format!(
                "the log could not be read to check the citations: {why}"
            ));
        }
        if self.writes
            && let Err(why) = self.effects().await
        {
            return closed(why);
        }
        let accept = self.shared.ports.policy.accept(&self.profile, &self.claim);
        let response = match accept.await {
            Ok(response) => response,
            Err(failure) => {
                return closed(format!("the acceptance rules could not be run: {failure}"));
            }
        };
        let mut checks = response.checks;
        if !response.accepted {
            let reason = if response.reasons.is_empty() {
                "the acceptance rules did not accept the answer".to_owned()
            } else {
                response.reasons.join("; ")
            };
            return Verification::Rejected { reason, checks };
        }
        let verifiers = response.verifiers.iter().take(MAX_PROFILE_VERIFIERS);
        let verdicts = join_all(verifiers.map(|name| self.verifier(name.as_str()))).await;
        let reasons: Vec<String> = verdicts
            .iter()
            .filter(|check| !check.accepted())
            .map(|check| match check.reasons.as_slice() {
                [] => format!("{}: did not accept the answer", check.name),
                reasons => format!("{}: {}", check.name, reasons.join("; ")),
            })
            .collect();
        checks.extend(verdicts);
        if reasons.is_empty() {
            Verification::Accepted { checks }
        } else {
            Verification::Rejected {
                reason: reasons.join("; "),
                checks,
            }
        }
    }

    /// Looks for the citations the window lacked in the events before `before`.
    async fn cite_older(&mut self, before: u64) -> Result<(), String> {
        let events = read_log(self.shared.store.as_ref(), self.id, before, usize::MAX)
            .await
            .map_err(|error| error.to_string())?
            .unwrap_or_default();
        cite(events.iter(), &self.claim.evidence, &mut self.claim.cited);
        Ok(())
    }

    /// Every ledger entry of the invocation, into the claim.
    async fn effects(&mut self) -> Result<(), String> {
        self.claim.effects = ledger_entries(self.shared.ports.ledger.as_ref(), self.id).await?;
        Ok(())
    }

    /// One verifier's verdict; a verifier that cannot be asked has not accepted.
    async fn verifier(&self, name: &str) -> Check {
        let verify = self
            .shared
            .ports
            .tools
            .verify(name, &self.claim, self.within);
        match verify.await {
            Ok(Some(check)) => Check {
                // The gateway names the check; the verifier asked is the one recorded.
                name: name.to_owned(),
                kind: CheckKind::Verifier,
                ..check
            },
            Ok(None) => undecided(name, "the tool gateway gave no verdict".to_owned()),
            Err(failure) => undecided(name, format!("it could not be asked: {failure}")),
        }
    }
}

/// Every ledger entry of invocation `id`, as many as an answer can be checked against
/// ([`MAX_CLAIM_EFFECTS`]); why not, otherwise.
pub(crate) async fn ledger_entries(
    ledger: &dyn LedgerPort,
    id: Uuid,
) -> Result<Vec<Effect>, String> {
    let mut entries = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = ledger
            .list_by_invocation(id, LEDGER_PAGE, &page_token)
            .await
            .map_err(|failure| format!("the effect ledger could not be asked: {failure}"))?;
        entries.extend(page.entries);
        if entries.len() > MAX_CLAIM_EFFECTS {
            return Err(format!(
                "the invocation has more than {MAX_CLAIM_EFFECTS} writes in the effect ledger, more than an answer can be checked against"
            ));
        }
        if page.next_page_token.is_empty() {
            return Ok(entries);
        }
        page_token = page.next_page_token;
    }
}

fn undecided(name: &str, reason: String) -> Check {
    Check {
        name: name.to_owned(),
        kind: CheckKind::Verifier,
        verdict: CheckVerdict::Undecided,
        reasons: vec![reason],
        evidence: Vec::new(),
    }
}

/// Not accepted because nothing could check it.
fn closed(reason: String) -> Verification {
    Verification::Rejected {
        reason,
        checks: Vec::new(),
    }
}
