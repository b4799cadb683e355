//! Replay against today's rules: the decisions a committed invocation made, judged again
//! by the policy port as it is configured now (schemas, Cedar policies, approval gates,
//! the tool registry) and its final answers by today's acceptance rules, without running
//! a tool, asking a verifier or writing anything. What comes out is the difference: the
//! calls that ran and would now be refused or held for a human, the calls refused then
//! that would now run, the answers accepted then that would now fail.
//!
//! A batch is judged as the runner judged it: validated against the tools and bounds the
//! invocation started with, then authorized for its actor, tenant and roles, with the digest a
//! human approved it under, if one did.

use agentloop_engine::{
    EventBody, Fingerprint, ProposedDecision, TerminalReason, TurnRecord, Verdict,
};
use agentloop_store::{EventStore, StoredEvent};
use serde::Serialize;
use uuid::Uuid;

use crate::context::{cite, read_log};
use crate::ports::{Batch, Claim, LedgerPort, PolicyPort};
use crate::verify::ledger_entries;
use crate::{InvocationSpec, RuntimeError};

/// Most events of one invocation replayed: bounds the memory of one replay.
pub const MAX_REPLAYED_EVENTS: usize = 100_000;

/// What today's rules make of one committed invocation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Replayed {
    /// The invocation.
    pub invocation_id: String,
    /// How it ended, if it has.
    pub reason: Option<TerminalReason>,
    /// Batches judged again.
    pub batches: usize,
    /// Calls judged again.
    pub calls: usize,
    /// Final answers checked again.
    pub answers: usize,
    /// Calls that ran, and that today's rules refuse.
    pub now_refused: Vec<Changed>,
    /// Calls that ran without a human's approval, and that today's rules hold for one.
    pub now_need_approval: Vec<Changed>,
    /// Calls that were refused, and that today's rules let run.
    pub now_allowed: Vec<Changed>,
    /// Final answers that were accepted, and that today's acceptance rules reject.
    pub answers_now_rejected: Vec<AnswerChanged>,
}

impl Replayed {
    /// Whether today's rules would have decided anything differently.
    pub fn changed(&self) -> bool {
        !(self.now_refused.is_empty()
            && self.now_need_approval.is_empty()
            && self.now_allowed.is_empty()
            && self.answers_now_rejected.is_empty())
    }
}

/// A call that today's rules decide differently.
#[derive(Debug, Clone, Serialize)]
pub struct Changed {
    /// The turn that proposed it.
    pub turn: u32,
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool: String,
    /// Its arguments, as JSON text.
    pub arguments_json: String,
    /// Why, in today's words.
    pub why: String,
    /// The policies that decide it today (IDs only).
    pub policies: Vec<String>,
}

/// A final answer that today's acceptance rules reject.
#[derive(Debug, Clone, Serialize)]
pub struct AnswerChanged {
    /// The turn that gave it.
    pub turn: u32,
    /// Why it is rejected.
    pub reasons: Vec<String>,
}

/// How a call of the log fared when it was proposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// It ran (it has a result).
    Ran,
    /// Policy refused it (by name, or the whole batch with a reason naming no call).
    Refused,
    /// Neither: refused with its batch for another call's sake, denied by a human, or
    /// still waiting.
    Held,
}

/// Replays invocation `id` of `store` against `policy` (and `ledger` for the writes an
/// answer is checked against). Nothing is written.
///
/// # Errors
///
/// [`RuntimeError::NotFound`] for an unknown invocation; the store's, the policy's and
/// the ledger's failures; an invocation beyond [`MAX_REPLAYED_EVENTS`].
pub async fn replay(
    store: &dyn EventStore,
    policy: &dyn PolicyPort,
    ledger: &dyn LedgerPort,
    id: Uuid,
) -> Result<Replayed, RuntimeError> {
    let record = store.get(id).await?;
    let spec = InvocationSpec::of(&record)?;
    let events = read_log(store, id, u64::MAX, MAX_REPLAYED_EVENTS)
        .await?
        .ok_or_else(|| {
            RuntimeError::FailedPrecondition(format!(
                "invocation {id} has more than {MAX_REPLAYED_EVENTS} events, more than one replay reads"
            ))
        })?;
    let mut replayed = Replayed {
        invocation_id: id.to_string(),
        reason: record.end.as_ref().map(|end| end.reason),
        ..Replayed::default()
    };
    let unavailable = |what: &str, failure: &dyn std::fmt::Display| {
        RuntimeError::Unavailable(format!("{what}: {failure}"))
    };
    for (index, turn) in last_of_each_turn(&events) {
        match &turn.decision {
            ProposedDecision::ToolCalls { .. } | ProposedDecision::RequestApproval { .. } => {}
            ProposedDecision::Final { answer, evidence } => {
                // Only an answer that was accepted can now fail; one refused then is
                // already in the log as refused.
                if turn.rejection.is_some() {
                    continue;
                }
                replayed.answers += 1;
                let mut claim = Claim {
                    invocation_id: id.to_string(),
                    actor: spec.actor.clone(),
                    tenant: spec.tenant.clone(),
                    goal: spec.goal.clone(),
                    answer: answer.clone(),
                    evidence: evidence.clone(),
                    cited: Vec::new(),
                    effects: ledger_entries(ledger, id)
                        .await
                        .map_err(RuntimeError::Unavailable)?,
                };
                cite(events[..index].iter(), evidence, &mut claim.cited);
                let acceptance = policy
                    .accept(&spec.profile, &claim)
                    .await
                    .map_err(|failure| unavailable("the acceptance rules", &failure))?;
                if !acceptance.accepted {
                    replayed.answers_now_rejected.push(AnswerChanged {
                        turn: turn.turn,
                        reasons: acceptance.reasons,
                    });
                }
                continue;
            }
            ProposedDecision::Clarification { .. }
            | ProposedDecision::CannotContinue { .. }
            | ProposedDecision::Unparseable { .. } => continue,
        }
        // A decision that was no valid batch then was never judged by policy.
        let Ok(batch) = turn.batch(&spec.tools, &spec.limits.bounds) else {
            continue;
        };
        replayed.batches += 1;
        replayed.calls += batch.calls.len();
        let approved = approved_before(&events[..index], &batch.fingerprint);
        let authorization = policy
            .authorize(Batch {
                invocation: id,
                turn: turn.turn,
                profile: &spec.profile,
                actor: &spec.actor,
                tenant: &spec.tenant,
                roles: spec.roles(),
                calls: &batch.calls,
                approved: approved.then_some(batch.fingerprint),
            })
            .await
            .map_err(|failure| unavailable("policy", &failure))?;
        for call in &batch.calls {
            let then = then(turn, call.call_id.as_str());
            let changed = |why: String, policies: Vec<String>| Changed {
                turn: turn.turn,
                call_id: call.call_id.to_string(),
                tool: call.tool.clone(),
                arguments_json: call.arguments_json.clone(),
                why,
                policies,
            };
            match &authorization.verdict {
                Verdict::Allow => {
                    if then == Then::Refused {
                        let policies = authorization
                            .permits
                            .iter()
                            .find(|permit| permit.call_id == call.call_id)
                            .map(|permit| permit.policies.clone())
                            .unwrap_or_default();
                        replayed
                            .now_allowed
                            .push(changed("allowed".to_owned(), policies));
                    }
                }
                Verdict::Deny { reason, refusals } => {
                    // A batch-wide reason refuses every call; otherwise only those named.
                    let refusal = refusals.iter().find(|r| r.call_id == call.call_id);
                    if then == Then::Ran && (refusals.is_empty() || refusal.is_some()) {
                        let (why, policies) = match refusal {
                            Some(refusal) => (refusal.message.clone(), refusal.policies.clone()),
                            None => (reason.clone(), Vec::new()),
                        };
                        replayed.now_refused.push(changed(why, policies));
                    }
                }
                Verdict::RequireApproval { reason } => {
                    if then == Then::Ran && !approved {
                        replayed
                            .now_need_approval
                            .push(changed(reason.clone(), Vec::new()));
                    }
                }
            }
        }
    }
    Ok(replayed)
}

/// Each turn's last committed record, with its index in `events`: a turn reopened by an
/// approval is committed again, with the results of its calls.
fn last_of_each_turn(events: &[StoredEvent]) -> Vec<(usize, &TurnRecord)> {
    let mut turns: Vec<(usize, &TurnRecord)> = Vec::new();
    for (index, stored) in events.iter().enumerate() {
        let (EventBody::Turn(turn) | EventBody::BatchStarted(turn)) = &stored.event.body else {
            continue;
        };
        match turns.last_mut() {
            Some(last) if last.1.turn == turn.turn => *last = (index, turn),
            Some(_) | None => turns.push((index, turn)),
        }
    }
    turns
}

/// Whether a human approved the batch with digest `proposal` before it ran.
fn approved_before(events: &[StoredEvent], proposal: &Fingerprint) -> bool {
    events.iter().any(|stored| {
        matches!(&stored.event.body, EventBody::ApprovalResolved(resolution)
            if resolution.approved && &resolution.proposal == proposal)
    })
}

/// How call `call_id` of `turn` fared when it was proposed.
fn then(turn: &TurnRecord, call_id: &str) -> Then {
    if turn
        .results
        .iter()
        .any(|result| result.call_id.as_str() == call_id)
    {
        Then::Ran
    } else if turn.rejection.as_ref().is_some_and(|rejection| {
        rejection.refusals.is_empty()
            || rejection
                .refusals
                .iter()
                .any(|refusal| refusal.call_id.as_str() == call_id)
    }) {
        Then::Refused
    } else {
        Then::Held
    }
}
