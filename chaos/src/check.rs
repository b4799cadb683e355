//! The checker: what the executor recorded, what the ledger says and what the log shows,
//! held against the promises. Pure: [`check`] reads only what it is given.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

/// An invocation of the workload, as the API shows it at the end.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// Its ID.
    pub id: String,
    /// Its terminal reason (`completed`, ...), or `None` while it has not ended.
    pub reason: Option<String>,
    /// The calls of it that write, by call ID: each must be applied once if it completes.
    pub writes: Vec<String>,
}

/// An effect the ledger holds.
#[derive(Debug, Clone)]
pub struct LedgerEffect {
    pub invocation_id: String,
    pub call_id: String,
    pub effect_key: String,
    /// `committed`, `rejected`, `reconciliation_required`, or an unresolved state
    /// (`prepared`, `dispatched`, `outcome_unknown`).
    pub state: String,
}

/// A write the executor applied, from its own record.
#[derive(Debug, Clone)]
pub struct Applied {
    pub invocation_id: String,
    pub call_id: String,
    pub effect_key: String,
}

/// One step of the log's fencing trail, in the order steps took effect.
#[derive(Debug, Clone, Copy)]
pub struct TrailStep {
    pub invocation_id: uuid::Uuid,
    pub lease_epoch: u64,
    /// The event's seq; `None` for a claim of the epoch.
    pub seq: Option<u64>,
}

/// Everything the checker reads.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub invocations: Vec<Invocation>,
    pub ledger: Vec<LedgerEffect>,
    pub record: Vec<Applied>,
    pub trail: Vec<TrailStep>,
}

/// What the checker found; every list empty means every promise held.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verdict {
    /// A write applied more than once.
    pub duplicate_writes: Vec<String>,
    /// A write of a completed invocation never applied, or one the ledger holds committed
    /// that the executor never applied.
    pub lost_writes: Vec<String>,
    /// A write the executor applied that the ledger holds as rejected.
    pub contradicted_writes: Vec<String>,
    /// An event committed under an older epoch than the last claim before it.
    pub stale_commits: Vec<String>,
    /// An invocation that never ended.
    pub unfinished: Vec<String>,
    /// An ended invocation's effect left unresolved, not `reconciliation_required`.
    pub unresolved_effects: Vec<String>,
    /// Writes applied, in all.
    pub writes_applied: usize,
    /// Epochs raised after an invocation's first: its lease taken over, or taken again
    /// after it was lost.
    pub takeovers: usize,
    /// Invocations by terminal reason (`running` for those that did not end).
    pub reasons: BTreeMap<String, usize>,
}

impl Verdict {
    /// Whether every promise held.
    pub fn holds(&self) -> bool {
        self.duplicate_writes.is_empty()
            && self.lost_writes.is_empty()
            && self.contradicted_writes.is_empty()
            && self.stale_commits.is_empty()
            && self.unfinished.is_empty()
            && self.unresolved_effects.is_empty()
    }

    /// The broken promises, one line each (at most `limit` per kind).
    pub fn failures(&self, limit: usize) -> Vec<String> {
        let kinds = [
            ("duplicate write", &self.duplicate_writes),
            ("lost write", &self.lost_writes),
            ("contradicted write", &self.contradicted_writes),
            ("stale commit", &self.stale_commits),
            ("unfinished", &self.unfinished),
            ("unresolved effect", &self.unresolved_effects),
        ];
        kinds
            .iter()
            .flat_map(|(kind, found)| {
                found
                    .iter()
                    .take(limit)
                    .map(move |what| format!("{kind}: {what}"))
            })
            .collect()
    }
}

/// The states of an effect that say its outcome is settled or handed to an operator.
const SETTLED: [&str; 3] = ["committed", "rejected", "reconciliation_required"];

/// Holds `observed` against the promises.
pub fn check(observed: &Observed) -> Verdict {
    let mut verdict = Verdict {
        writes_applied: observed.record.len(),
        ..Verdict::default()
    };

    let mut applied: HashMap<(&str, &str), Vec<&Applied>> = HashMap::new();
    for write in &observed.record {
        applied
            .entry((write.invocation_id.as_str(), write.call_id.as_str()))
            .or_default()
            .push(write);
    }
    for ((invocation, call), writes) in &applied {
        if writes.len() > 1 {
            let keys: Vec<&str> = writes.iter().map(|w| w.effect_key.as_str()).collect();
            verdict.duplicate_writes.push(format!(
                "invocation {invocation} call {call} applied {} times (effect keys {})",
                writes.len(),
                keys.join(", ")
            ));
        }
    }

    let mut ended: HashMap<&str, &str> = HashMap::new();
    for invocation in &observed.invocations {
        let reason = invocation.reason.as_deref().unwrap_or("running");
        *verdict.reasons.entry(reason.to_owned()).or_default() += 1;
        let Some(reason) = invocation.reason.as_deref() else {
            verdict.unfinished.push(invocation.id.clone());
            continue;
        };
        ended.insert(invocation.id.as_str(), reason);
        if reason == "completed" {
            for call in &invocation.writes {
                if !applied.contains_key(&(invocation.id.as_str(), call.as_str())) {
                    verdict.lost_writes.push(format!(
                        "invocation {} completed, yet its write {call} was never applied",
                        invocation.id
                    ));
                }
            }
        }
    }

    let by_key: HashMap<&str, &Applied> = observed
        .record
        .iter()
        .map(|write| (write.effect_key.as_str(), write))
        .collect();
    for effect in &observed.ledger {
        let what = || {
            format!(
                "invocation {} call {} (effect key {})",
                effect.invocation_id, effect.call_id, effect.effect_key
            )
        };
        let done = by_key.contains_key(effect.effect_key.as_str());
        match effect.state.as_str() {
            "committed" if !done => verdict.lost_writes.push(format!(
                "{}: committed in the ledger, never applied",
                what()
            )),
            "rejected" if done => verdict
                .contradicted_writes
                .push(format!("{}: applied, yet rejected in the ledger", what())),
            state
                if !SETTLED.contains(&state)
                    && ended.contains_key(effect.invocation_id.as_str()) =>
            {
                verdict.unresolved_effects.push(format!(
                    "{}: {state} after the invocation ended ({})",
                    what(),
                    ended[effect.invocation_id.as_str()]
                ));
            }
            _ => {}
        }
    }

    // The trail is in the order steps took effect. A claim raises the invocation's epoch,
    // and so does a commit under a newer one (a worker's first commit claims as it
    // commits): every event must carry the newest epoch raised before it.
    let mut newest: HashMap<uuid::Uuid, u64> = HashMap::new();
    for step in &observed.trail {
        let current = newest.entry(step.invocation_id).or_insert(0);
        if let Some(seq) = step.seq
            && step.lease_epoch < *current
        {
            verdict.stale_commits.push(format!(
                "invocation {} seq {seq} committed under epoch {} after epoch {} was claimed",
                step.invocation_id, step.lease_epoch, *current
            ));
            continue;
        }
        if step.lease_epoch > *current {
            if *current > 0 {
                verdict.takeovers += 1;
            }
            *current = step.lease_epoch;
        }
    }
    for found in [
        &mut verdict.duplicate_writes,
        &mut verdict.lost_writes,
        &mut verdict.contradicted_writes,
        &mut verdict.unresolved_effects,
    ] {
        found.sort();
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invocation(id: &str, reason: Option<&str>) -> Invocation {
        Invocation {
            id: id.into(),
            reason: reason.map(Into::into),
            writes: vec!["b".into()],
        }
    }

    fn applied(id: &str, key: &str) -> Applied {
        Applied {
            invocation_id: id.into(),
            call_id: "b".into(),
            effect_key: key.into(),
        }
    }

    fn effect(id: &str, key: &str, state: &str) -> LedgerEffect {
        LedgerEffect {
            invocation_id: id.into(),
            call_id: "b".into(),
            effect_key: key.into(),
            state: state.into(),
        }
    }

    fn step(id: uuid::Uuid, epoch: u64, seq: Option<u64>) -> TrailStep {
        TrailStep {
            invocation_id: id,
            lease_epoch: epoch,
            seq,
        }
    }

    #[test]
    fn a_clean_history_holds() {
        let id = uuid::Uuid::from_u128(1);
        let observed = Observed {
            invocations: vec![invocation("a", Some("completed"))],
            ledger: vec![effect("a", "k1", "committed")],
            record: vec![applied("a", "k1")],
            // The first commit raises the epoch itself; a takeover claims 2, and the new
            // worker's commit after it raises 3 without a claim of its own.
            trail: vec![
                step(id, 1, Some(1)),
                step(id, 2, None),
                step(id, 2, Some(2)),
                step(id, 3, Some(3)),
            ],
        };
        let verdict = check(&observed);
        assert!(verdict.holds(), "{verdict:?}");
        assert_eq!(verdict.takeovers, 2);
        assert_eq!(verdict.writes_applied, 1);
        assert_eq!(verdict.reasons["completed"], 1);
    }

    #[test]
    fn each_broken_promise_is_found() {
        let id = uuid::Uuid::from_u128(1);
        let observed = Observed {
            invocations: vec![
                invocation("twice", Some("completed")),
                invocation("never", Some("completed")),
                invocation("stuck", None),
                invocation("unknown", Some("tool_error")),
            ],
            ledger: vec![
                effect("twice", "k1", "committed"),
                effect("ghost", "k9", "committed"),
                effect("denied", "k5", "rejected"),
                effect("unknown", "k7", "outcome_unknown"),
                effect("stuck", "k8", "dispatched"),
            ],
            record: vec![
                applied("twice", "k1"),
                applied("twice", "k2"),
                applied("denied", "k5"),
            ],
            trail: vec![
                step(id, 1, Some(1)),
                step(id, 3, Some(2)),
                step(id, 2, Some(3)),
                step(id, 4, None),
                step(id, 3, Some(4)),
            ],
        };
        let verdict = check(&observed);
        assert!(!verdict.holds());
        assert_eq!(verdict.duplicate_writes.len(), 1, "{verdict:?}");
        assert!(verdict.duplicate_writes[0].contains("applied 2 times"));
        // `never` completed without its write; `ghost` is committed in the ledger only.
        assert_eq!(verdict.lost_writes.len(), 2, "{verdict:?}");
        assert_eq!(verdict.contradicted_writes.len(), 1);
        assert_eq!(verdict.stale_commits.len(), 2, "{verdict:?}");
        assert!(verdict.stale_commits[0].contains("seq 3 committed under epoch 2 after epoch 3"));
        assert!(verdict.stale_commits[1].contains("seq 4 committed under epoch 3 after epoch 4"));
        assert_eq!(verdict.unfinished, ["stuck"]);
        // The running invocation's dispatched effect is not yet a broken promise.
        assert_eq!(verdict.unresolved_effects.len(), 1, "{verdict:?}");
        assert!(verdict.unresolved_effects[0].contains("outcome_unknown"));
        assert_eq!(verdict.failures(10).len(), 8);
    }
}
