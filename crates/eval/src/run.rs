//! What one run showed, read from its committed log and the effect ledger, and how it is
//! judged against its case's expectations.

use std::collections::BTreeSet;

use agentloop_engine::TerminalReason;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::case::{AnswerCheck, ExpectedCall, Loaded, Match, micro_usd};

/// One run, as its log and the ledger record it.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// The invocation.
    pub invocation_id: String,
    /// How it ended (or the wait it was left in, when no human reply was left).
    pub reason: TerminalReason,
    /// The end's detail.
    pub detail: String,
    /// The final answer, if it completed.
    pub answer: Option<String>,
    /// The call IDs the final answer cited.
    pub evidence: Vec<String>,
    /// Every call the model proposed, in order, once each (a turn reopened by an
    /// approval proposes its calls once).
    pub calls: Vec<Call>,
    /// Turns committed.
    pub turns: u32,
    /// Input and output tokens.
    pub tokens: u64,
    /// Cost in micro-dollars.
    pub cost_micro_usd: u64,
    /// From the start request to the end, in milliseconds.
    pub duration_ms: u64,
    /// The effect ledger's entries of the invocation.
    pub effects: Vec<Effect>,
    /// The effect keys of the writes the executor's own record says it applied, once per
    /// application, when the executor keeps one (the demo executor does).
    pub record: Option<Vec<String>>,
}

/// A call the model proposed.
#[derive(Debug, Clone, Serialize)]
pub struct Call {
    /// The turn that proposed it.
    pub turn: u32,
    /// Its ID.
    pub id: String,
    /// Its tool.
    pub name: String,
    /// Its arguments (`null` when they were not JSON).
    pub arguments: Value,
    /// How it ended, if it ran.
    pub outcome: Outcome,
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It was never sent: refused, held for approval and denied, or the run ended first.
    NotRun,
    /// It returned an output.
    Output,
    /// It returned an error.
    Error,
    /// It was cancelled, or never started.
    Cancelled,
    /// Nobody knows whether it took effect.
    Unknown,
}

/// An entry of the effect ledger.
#[derive(Debug, Clone, Serialize)]
pub struct Effect {
    /// The call it records.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The effect key.
    pub key: String,
    /// The executor applied it.
    pub applied: bool,
}

impl Run {
    /// The calls that returned something (an output or an error).
    fn ran(&self, call_id: &str) -> bool {
        self.calls.iter().any(|call| {
            call.id == call_id && matches!(call.outcome, Outcome::Output | Outcome::Error)
        })
    }

    /// Applications beyond the first of an effect key: a write applied twice, by the
    /// ledger or, where the executor keeps a record, by that record.
    pub fn duplicate_effects(&self) -> usize {
        let mut seen = BTreeSet::new();
        let ledger = self
            .effects
            .iter()
            .filter(|effect| effect.applied && !seen.insert(effect.key.as_str()))
            .count();
        let mut seen = BTreeSet::new();
        let record = self
            .record
            .iter()
            .flatten()
            .filter(|key| !seen.insert(key.as_str()))
            .count();
        ledger.max(record)
    }

    /// Where the executor's record and the ledger disagree: a write the executor applied
    /// that the ledger does not show applied (or the other way round).
    fn unrecorded(&self) -> Option<String> {
        let record: BTreeSet<&str> = self.record.as_ref()?.iter().map(String::as_str).collect();
        let ledger: BTreeSet<&str> = self
            .effects
            .iter()
            .filter(|effect| effect.applied)
            .map(|effect| effect.key.as_str())
            .collect();
        if let Some(key) = record.difference(&ledger).next() {
            return Some(format!(
                "the executor applied effect {key}, which the ledger does not show applied"
            ));
        }
        ledger.difference(&record).next().map(|key| {
            format!("the ledger shows effect {key} applied, which the executor's record lacks")
        })
    }

    /// Applied effects of calls the log does not show as run: a write nobody allowed.
    pub fn unauthorized_effects(&self) -> usize {
        self.effects
            .iter()
            .filter(|effect| effect.applied && !self.ran(&effect.call_id))
            .count()
    }

    /// The applied writes, as calls (their arguments from the log).
    fn applied(&self) -> Vec<&Call> {
        self.effects
            .iter()
            .filter(|effect| effect.applied)
            .map(|effect| {
                self.calls
                    .iter()
                    .find(|call| call.id == effect.call_id)
                    .unwrap_or(&UNKNOWN_CALL)
            })
            .collect()
    }
}

/// Stands for an applied effect whose call the log does not have.
static UNKNOWN_CALL: Call = Call {
    turn: 0,
    id: String::new(),
    name: String::new(),
    arguments: Value::Null,
    outcome: Outcome::NotRun,
};

/// Every way `run` differs from what `case` expects, in the order they are checked
/// (the first is the one a report shows).
pub fn judge(case: &Loaded, run: &Run) -> Vec<String> {
    let expect = &case.case.expect;
    let mut differences = Vec::new();
    if let Some(reasons) = &expect.reason {
        let reasons = reasons.all();
        if !reasons.contains(&run.reason) {
            let wanted: Vec<String> = reasons.iter().map(ToString::to_string).collect();
            differences.push(format!(
                "reason: ended {}, expected {} ({})",
                run.reason,
                wanted.join(" or "),
                run.detail
            ));
        }
    }
    if let Some(trajectory) = &expect.trajectory {
        let made: Vec<&Call> = run.calls.iter().collect();
        if let Some(difference) = compare(trajectory.mode, &trajectory.calls, &made) {
            differences.push(format!(
                "trajectory ({}): {difference}",
                mode_name(trajectory.mode)
            ));
        }
    }
    if let Some(effects) = &expect.effects {
        if let Some(difference) = compare(Match::AnyOrder, effects, &run.applied()) {
            differences.push(format!("effects: {difference}"));
        }
        let duplicates = run.duplicate_effects();
        if duplicates > 0 {
            differences.push(format!("effects: {duplicates} applied more than once"));
        }
        if let Some(disagreement) = run.unrecorded() {
            differences.push(format!("effects: {disagreement}"));
        }
    }
    if let Some(check) = &expect.answer {
        let answer = run.answer.as_deref();
        let fits = match (check, answer, &case.answer_pattern) {
            (AnswerCheck::Contains(text), Some(answer), _) => answer.contains(text.as_str()),
            (AnswerCheck::Matches(_), Some(answer), Some(pattern)) => pattern.is_match(answer),
            (_, None, _) | (AnswerCheck::Matches(_), Some(_), None) => false,
        };
        if !fits {
            let wanted = match check {
                AnswerCheck::Contains(text) => format!("to contain {text:?}"),
                AnswerCheck::Matches(pattern) => format!("to match /{pattern}/"),
            };
            differences.push(match answer {
                Some(answer) => format!("answer: {answer:?}, expected {wanted}"),
                None => format!("answer: none, expected {wanted}"),
            });
        }
    }
    if let Some(evidence) = &expect.evidence {
        for wanted in evidence {
            let cited = run.evidence.iter().any(|id| {
                id == wanted
                    || run
                        .calls
                        .iter()
                        .any(|call| &call.id == id && &call.name == wanted)
            });
            if !cited {
                differences.push(format!(
                    "evidence: {wanted:?} is not cited (cited: {})",
                    run.evidence.join(", ")
                ));
            }
        }
    }
    let over = |what: &str, value: u64, limit: Option<u64>, differences: &mut Vec<String>| {
        if let Some(limit) = limit
            && value > limit
        {
            differences.push(format!("{what}: {value}, more than {limit}"));
        }
    };
    over(
        "turns",
        u64::from(run.turns),
        expect.max_turns.map(u64::from),
        &mut differences,
    );
    let calls = u64::try_from(run.calls.len()).unwrap_or(u64::MAX);
    over(
        "tool calls",
        calls,
        expect.max_tool_calls.map(u64::from),
        &mut differences,
    );
    over("tokens", run.tokens, expect.max_tokens, &mut differences);
    over(
        "cost in micro-dollars",
        run.cost_micro_usd,
        expect.max_cost_usd.and_then(micro_usd),
        &mut differences,
    );
    over(
        "duration in ms",
        run.duration_ms,
        expect.max_duration_ms,
        &mut differences,
    );
    differences
}

fn mode_name(mode: Match) -> &'static str {
    match mode {
        Match::Exact => "exact",
        Match::InOrder => "in_order",
        Match::AnyOrder => "any_order",
        Match::Subset => "subset",
        Match::Superset => "superset",
    }
}

/// Whether `call` is the call `expected` describes: the same tool, and every argument
/// given the same (objects compared key by key, only the keys given).
pub fn matches(expected: &ExpectedCall, call: &Call) -> bool {
    expected.name == call.name
        && match call.arguments.as_object() {
            Some(arguments) => contains(arguments, &expected.arguments),
            None => expected.arguments.is_empty(),
        }
}

fn contains(actual: &Map<String, Value>, wanted: &Map<String, Value>) -> bool {
    wanted
        .iter()
        .all(|(key, wanted)| match (actual.get(key), wanted) {
            (Some(Value::Object(actual)), Value::Object(wanted)) => contains(actual, wanted),
            (Some(actual), wanted) => actual == wanted,
            (None, _) => false,
        })
}

fn describe_expected(call: &ExpectedCall) -> String {
    if call.arguments.is_empty() {
        call.name.clone()
    } else {
        format!("{} {}", call.name, Value::Object(call.arguments.clone()))
    }
}

fn describe(call: &Call) -> String {
    if call.id.is_empty() {
        "a call the log does not have".to_owned()
    } else {
        format!("{} {} (call {})", call.name, call.arguments, call.id)
    }
}

/// The first difference between the `expected` calls and those `made`, under `mode`.
fn compare(mode: Match, expected: &[ExpectedCall], made: &[&Call]) -> Option<String> {
    match mode {
        Match::Exact => {
            for (index, wanted) in expected.iter().enumerate() {
                match made.get(index) {
                    Some(call) if matches(wanted, call) => {}
                    Some(call) => {
                        return Some(format!(
                            "call {} is {}, expected {}",
                            index + 1,
                            describe(call),
                            describe_expected(wanted)
                        ));
                    }
                    None => {
                        return Some(format!(
                            "{} calls made, expected {}: {} is missing",
                            made.len(),
                            expected.len(),
                            describe_expected(wanted)
                        ));
                    }
                }
            }
            made.get(expected.len()).map(|extra| {
                format!(
                    "call {} is {}, beyond the expected",
                    expected.len() + 1,
                    describe(extra)
                )
            })
        }
        Match::InOrder => {
            let mut next = 0;
            for wanted in expected {
                match made[next..].iter().position(|call| matches(wanted, call)) {
                    Some(found) => next += found + 1,
                    None => {
                        return Some(format!(
                            "{} is not made after the calls matched before it",
                            describe_expected(wanted)
                        ));
                    }
                }
            }
            None
        }
        // Set inclusion: a pattern may stand for any number of calls.
        Match::Subset => made
            .iter()
            .find(|call| !expected.iter().any(|wanted| matches(wanted, call)))
            .map(|call| format!("{} is not expected", describe(call))),
        Match::AnyOrder | Match::Superset => {
            let pairs = pairing(expected, made);
            let unmatched_expected = expected
                .iter()
                .enumerate()
                .find(|(index, _)| pairs.iter().all(|(e, _)| e != index));
            let unmatched_made = made
                .iter()
                .enumerate()
                .find(|(index, _)| pairs.iter().all(|(_, m)| m != index));
            if let Some((_, wanted)) = unmatched_expected {
                return Some(format!("{} is not made", describe_expected(wanted)));
            }
            match (mode, unmatched_made) {
                (Match::AnyOrder, Some((_, call))) => {
                    Some(format!("{} is not expected", describe(call)))
                }
                _ => None,
            }
        }
    }
}

/// A largest pairing of expected calls with calls made, each used once (Kuhn's
/// augmenting paths: one call may fit several patterns, so a greedy pairing can miss).
fn pairing(expected: &[ExpectedCall], made: &[&Call]) -> Vec<(usize, usize)> {
    let fits: Vec<Vec<usize>> = expected
        .iter()
        .map(|wanted| {
            (0..made.len())
                .filter(|&index| matches(wanted, made[index]))
                .collect()
        })
        .collect();
    let mut owner: Vec<Option<usize>> = vec![None; made.len()];
    for start in 0..expected.len() {
        let mut visited = vec![false; made.len()];
        augment(start, &fits, &mut owner, &mut visited);
    }
    owner
        .iter()
        .enumerate()
        .filter_map(|(made, expected)| expected.map(|expected| (expected, made)))
        .collect()
}

fn augment(
    expected: usize,
    fits: &[Vec<usize>],
    owner: &mut [Option<usize>],
    visited: &mut [bool],
) -> bool {
    for &made in &fits[expected] {
        if visited[made] {
            continue;
        }
        visited[made] = true;
        let free = match owner[made] {
            None => true,
            Some(other) => augment(other, fits, owner, visited),
        };
        if free {
            owner[made] = Some(expected);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str, name: &str, arguments: Value) -> Call {
        Call {
            turn: 1,
            id: id.to_owned(),
            name: name.to_owned(),
            arguments,
            outcome: Outcome::Output,
        }
    }

    fn expected(name: &str, arguments: Value) -> ExpectedCall {
        ExpectedCall {
            name: name.to_owned(),
            arguments: arguments.as_object().cloned().unwrap_or_default(),
        }
    }

    /// Keys in order, so the text is the same whether or not serde_json keeps the order
    /// it was given (a feature another crate of the workspace turns on).
    fn made() -> Vec<Call> {
        vec![
            call(
                "a",
                "lookup",
                json!({"key": "orders", "page": {"after": 3, "size": 10}}),
            ),
            call("b", "lookup", json!({"key": "invoices"})),
            call(
                "c",
                "transfer",
                json!({"amount": 4200, "from": "alice", "to": "bob"}),
            ),
        ]
    }

    fn check(mode: Match, wanted: &[ExpectedCall]) -> Option<String> {
        let made = made();
        let made: Vec<&Call> = made.iter().collect();
        compare(mode, wanted, &made)
    }

    #[test]
    fn arguments_are_compared_key_by_key_and_only_the_keys_given() {
        let made = made();
        assert!(matches(&expected("lookup", json!({})), &made[0]));
        assert!(matches(
            &expected("lookup", json!({"page": {"size": 10}})),
            &made[0]
        ));
        assert!(!matches(
            &expected("lookup", json!({"page": {"size": 11}})),
            &made[0]
        ));
        assert!(!matches(
            &expected("lookup", json!({"missing": null})),
            &made[0]
        ));
        assert!(!matches(
            &expected("transfer", json!({"amount": "4200"})),
            &made[2]
        ));
        assert!(!matches(&expected("lookups", json!({})), &made[0]));
    }

    #[test]
    fn each_mode_accepts_what_it_promises_and_names_the_first_difference() {
        let all = [
            expected("lookup", json!({"key": "orders"})),
            expected("lookup", json!({"key": "invoices"})),
            expected("transfer", json!({"amount": 4200})),
        ];
        let swapped = [all[1].clone(), all[0].clone(), all[2].clone()];
        assert_eq!(check(Match::Exact, &all), None);
        assert_eq!(
            check(Match::Exact, &swapped).as_deref(),
            Some(
                r#"call 1 is lookup {"key":"orders","page":{"after":3,"size":10}} (call a), expected lookup {"key":"invoices"}"#
            )
        );
        assert_eq!(
            check(Match::Exact, &all[..2]).as_deref(),
            Some(
                r#"call 3 is transfer {"amount":4200,"from":"alice","to":"bob"} (call c), beyond the expected"#
            )
        );
        assert_eq!(check(Match::AnyOrder, &swapped), None);
        assert_eq!(
            check(Match::AnyOrder, &all[..2]).as_deref(),
            Some(r#"transfer {"amount":4200,"from":"alice","to":"bob"} (call c) is not expected"#)
        );
        assert_eq!(
            check(Match::InOrder, &[all[0].clone(), all[2].clone()]),
            None
        );
        assert_eq!(
            check(Match::InOrder, &[all[2].clone(), all[0].clone()]).as_deref(),
            Some(r#"lookup {"key":"orders"} is not made after the calls matched before it"#)
        );
        assert_eq!(check(Match::Superset, &all[1..]), None);
        assert!(check(Match::Subset, &all[1..]).is_some());
        let more = [
            all[0].clone(),
            all[1].clone(),
            all[2].clone(),
            expected("refund", json!({})),
        ];
        assert_eq!(check(Match::Subset, &more), None);
        assert_eq!(
            check(Match::Superset, &more).as_deref(),
            Some("refund is not made")
        );
    }

    /// A pattern that fits two calls must not take the one that a narrower pattern
    /// needs: any_order pairs them all.
    #[test]
    fn overlapping_patterns_are_paired_not_taken_greedily() {
        let wanted = [
            expected("lookup", json!({})),
            expected("lookup", json!({"key": "orders"})),
            expected("transfer", json!({})),
        ];
        assert_eq!(check(Match::AnyOrder, &wanted), None);
        // Subset is set inclusion: one pattern stands for both lookups made.
        let tools = [
            expected("lookup", json!({})),
            expected("transfer", json!({})),
        ];
        assert_eq!(check(Match::Subset, &tools), None);
        // Superset pairs each expected call with a call of its own.
        let three_lookups = [
            expected("lookup", json!({})),
            expected("lookup", json!({})),
            expected("lookup", json!({})),
        ];
        assert_eq!(
            check(Match::Superset, &three_lookups).as_deref(),
            Some("lookup is not made")
        );
    }

    #[test]
    fn duplicate_and_unauthorized_effects_are_counted() {
        let mut run = Run {
            invocation_id: "i".to_owned(),
            record: None,
            reason: TerminalReason::Completed,
            detail: String::new(),
            answer: None,
            evidence: Vec::new(),
            calls: made(),
            turns: 2,
            tokens: 0,
            cost_micro_usd: 0,
            duration_ms: 1,
            effects: vec![Effect {
                call_id: "c".to_owned(),
                tool: "transfer".to_owned(),
                key: "k1".to_owned(),
                applied: true,
            }],
        };
        assert_eq!(
            (run.duplicate_effects(), run.unauthorized_effects()),
            (0, 0)
        );
        run.effects.push(Effect {
            call_id: "c".to_owned(),
            tool: "transfer".to_owned(),
            key: "k1".to_owned(),
            applied: true,
        });
        run.effects.push(Effect {
            call_id: "z".to_owned(),
            tool: "transfer".to_owned(),
            key: "k2".to_owned(),
            applied: true,
        });
        run.calls[2].outcome = Outcome::NotRun;
        assert_eq!(
            (run.duplicate_effects(), run.unauthorized_effects()),
            (1, 3)
        );
        // The executor's own record counts too, and must agree with the ledger.
        run.effects.truncate(1);
        run.record = Some(vec!["k1".to_owned(), "k1".to_owned()]);
        assert_eq!(run.duplicate_effects(), 1);
        assert_eq!(run.unrecorded(), None);
        run.record = Some(vec!["k2".to_owned()]);
        assert_eq!(
            run.unrecorded().as_deref(),
            Some("the executor applied effect k2, which the ledger does not show applied")
        );
    }
}
