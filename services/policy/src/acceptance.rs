//! Acceptance of final answers: an answer is a claim, and it is accepted only when the
//! profile's rules, checked against the committed state the orchestrator found for it
//! (the cited results, the invocation's ledger entries), accept it. The model's words
//! are never the evidence.
//!
//! The rules, in the order they run:
//! - `answer`: not empty and within `max_answer_bytes`;
//! - `citations`: every cited call has a committed result in this invocation and that
//!   result is an output (with `require_citations`, the answer must cite at least one);
//! - `writes`: the ledger is the authority on writes: by default every entry of the
//!   invocation must be committed (`writes = "settled"` also lets rejected ones pass,
//!   `"unchecked"` turns the rule off);
//! - `require:<tool>`: a cited output of `<tool>` must exist, and satisfy every
//!   condition given (a JSON pointer into the output that equals a value, exists or not,
//!   or matches a regular expression).
//!
//! The profile's verifiers run after the rules accept; the orchestrator calls them.

use std::collections::BTreeMap;

use agentloop_effects::{Cited, Claim, EffectState};
use agentloop_engine::{
    CallOutcome, Check, CheckKind, CheckVerdict, MAX_CLAIM_EFFECTS, MAX_PROFILE_VERIFIERS,
};
use agentloop_proto::v1::{ValidateFinalRequest, ValidateFinalResponse};
use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use crate::tools::check_invocation_id;

/// Most citations one claim may carry; more is INVALID_ARGUMENT.
pub const MAX_EVIDENCE_REFS: usize = 256;
/// Most `require` entries of one profile, and conditions of one entry.
pub const MAX_REQUIREMENTS: usize = 32;
/// Largest compiled `matches` expression, in bytes of the regex engine's program.
const MAX_REGEX_SIZE: usize = 256 * 1024;

/// The acceptance rules of one profile (`[acceptance.<profile>]`). A profile without an
/// entry gets the defaults: cited results checked, every write committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Acceptance {
    /// Largest accepted answer, in bytes (default 64 KiB).
    pub max_answer_bytes: usize,
    /// Refuse an answer that cites no result: "no evidence, no success". Off by
    /// default, because a plain question needs no tool.
    pub require_citations: bool,
    /// What the ledger must say of the invocation's writes.
    pub writes: Writes,
    /// Evidence the answer must cite.
    pub require: Vec<Requirement>,
    /// Verifiers (registered at the tool gateway) that must each accept the claim.
    pub verifiers: Vec<String>,
}

/// Largest acceptance file [`Acceptance::load`] reads.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

impl Acceptance {
    /// One profile's rules from a TOML file holding the keys of its table (what
    /// `agentloop run --acceptance FILE` reads).
    ///
    /// # Errors
    ///
    /// [`PolicyError::Acceptance`] naming `profile` and the file, for a file that cannot
    /// be read, is too large, or does not hold valid rules.
    pub fn load(path: &std::path::Path, profile: &str) -> Result<Acceptance, PolicyError> {
        use std::io::Read as _;
        let failed = |detail: String| PolicyError::Acceptance {
            profile: profile.to_owned(),
            detail: format!("{}: {detail}", path.display()),
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|file| file.take(MAX_FILE_BYTES + 1).read_to_string(&mut text))
            .map_err(|error| failed(error.to_string()))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(failed(format!("larger than {MAX_FILE_BYTES} bytes")));
        }
        toml::from_str(&text).map_err(|error| failed(error.to_string()))
    }
}

impl Default for Acceptance {
    fn default() -> Self {
        Acceptance {
            max_answer_bytes: 64 * 1024,
            require_citations: false,
            writes: Writes::Committed,
            require: Vec::new(),
            verifiers: Vec::new(),
        }
    }
}

/// What the effect ledger must say of every write of the invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Writes {
    /// Every entry is committed: a rejected, unknown or unfinished write blocks
    /// completion.
    Committed,
    /// Every entry is settled, committed or rejected (the model may report a refusal);
    /// an unknown or unfinished one blocks completion.
    Settled,
    /// The ledger is not consulted.
    Unchecked,
}

/// Evidence a profile requires: a cited output of `tool`, satisfying every condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    /// The tool whose output must be cited.
    pub tool: String,
    /// Conditions on that output, all of which one cited output must satisfy.
    #[serde(default, rename = "where")]
    pub conditions: Vec<Condition>,
}

/// A condition on one point of a cited output: exactly one of `equals`, `exists` and
/// `matches`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// A JSON pointer (RFC 6901) into the output, e.g. `/status`; empty for the whole.
    pub pointer: String,
    /// The value there must equal this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<Json>,
    /// A value must be there (`true`) or must not (`false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exists: Option<bool>,
    /// The value there must be a string matching this regular expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<String>,
}

/// A JSON value in the configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Json(pub serde_json::Value);

// JSON values have no NaN, so equality is an equivalence.
impl Eq for Json {}

/// Every profile's rules, compiled (expressions built, bounds checked) once.
#[derive(Debug, Clone)]
pub struct AcceptanceRules {
    profiles: BTreeMap<String, Compiled>,
    default: Compiled,
}

#[derive(Debug, Clone)]
struct Compiled {
    config: Acceptance,
    require: Vec<Vec<(String, Test)>>,
}

#[derive(Debug, Clone)]
enum Test {
    Equals(serde_json::Value),
    Exists(bool),
    Matches(Regex),
}

impl Default for AcceptanceRules {
    fn default() -> Self {
        AcceptanceRules {
            profiles: BTreeMap::new(),
            default: Compiled {
                config: Acceptance::default(),
                require: Vec::new(),
            },
        }
    }
}

impl AcceptanceRules {
    /// Compiles each profile's rules. `tools` are the registered tools' names: a
    /// requirement on another tool could never be met.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Acceptance`] naming the profile and what is wrong.
    pub fn compile<'a>(
        profiles: &BTreeMap<String, Acceptance>,
        tools: impl IntoIterator<Item = &'a str> + Clone,
    ) -> Result<AcceptanceRules, PolicyError> {
        let mut compiled = BTreeMap::new();
        for (profile, config) in profiles {
            let failed = |detail: String| PolicyError::Acceptance {
                profile: profile.clone(),
                detail,
            };
            compiled.insert(
                profile.clone(),
                Compiled::new(config, tools.clone()).map_err(failed)?,
            );
        }
        Ok(AcceptanceRules {
            profiles: compiled,
            ..AcceptanceRules::default()
        })
    }

    /// Runs `profile`'s rules on the claim. Each rule that applies gives one check; the
    /// answer is accepted when all of them accept, and the answer names the profile's
    /// verifiers, which must accept it too.
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidRequest`] for a missing invocation ID, or a claim beyond its
    /// bounds.
    pub fn judge(
        &self,
        profile: &str,
        claim: &Claim,
    ) -> Result<agentloop_effects::Acceptance, PolicyError> {
        check_invocation_id(&claim.invocation_id)?;
        for (what, count, limit) in [
            ("evidence", claim.evidence.len(), MAX_EVIDENCE_REFS),
            ("cited", claim.cited.len(), MAX_EVIDENCE_REFS),
            ("effects", claim.effects.len(), MAX_CLAIM_EFFECTS),
        ] {
            if count > limit {
                return Err(PolicyError::InvalidRequest(format!(
                    "the claim has {count} {what}; at most {limit} are allowed"
                )));
            }
        }
        let rules = self.profiles.get(profile).unwrap_or(&self.default);
        let checks = rules.run(claim);
        let reasons = checks
            .iter()
            .flat_map(|check| check.reasons.iter().map(|r| format!("{}: {r}", check.name)))
            .collect::<Vec<_>>();
        Ok(agentloop_effects::Acceptance {
            accepted: checks.iter().all(|c| c.verdict == CheckVerdict::Accepted),
            reasons,
            checks,
            verifiers: rules.config.verifiers.clone(),
        })
    }

    /// [`AcceptanceRules::judge`] of a request as it came over the wire, answered the
    /// same way: the API's path, and the tests'.
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidRequest`] for a missing claim, then as
    /// [`AcceptanceRules::judge`].
    pub fn validate(
        &self,
        request: &ValidateFinalRequest,
    ) -> Result<ValidateFinalResponse, PolicyError> {
        let Some(claim) = &request.claim else {
            return Err(PolicyError::InvalidRequest("claim is required".into()));
        };
        let claim = agentloop_wire::claim_from(claim.clone());
        self.judge(&request.profile, &claim)
            .map(agentloop_wire::validate_final_response)
    }
}

impl Compiled {
    fn new<'a>(
        config: &Acceptance,
        tools: impl IntoIterator<Item = &'a str> + Clone,
    ) -> Result<Compiled, String> {
        if config.verifiers.len() > MAX_PROFILE_VERIFIERS {
            return Err(format!(
                "{} verifiers; at most {MAX_PROFILE_VERIFIERS} are allowed",
                config.verifiers.len()
            ));
        }
        if let Some(name) = config.verifiers.iter().find(|name| name.trim().is_empty()) {
            return Err(format!("a verifier name is empty ({name:?})"));
        }
        if config.require.len() > MAX_REQUIREMENTS {
            return Err(format!(
                "{} `require` entries; at most {MAX_REQUIREMENTS} are allowed",
                config.require.len()
            ));
        }
        let mut require = Vec::with_capacity(config.require.len());
        for requirement in &config.require {
            let tool = &requirement.tool;
            if !tools.clone().into_iter().any(|known| known == tool) {
                return Err(format!(
                    "`require` names tool {tool:?}, which is not registered"
                ));
            }
            if requirement.conditions.len() > MAX_REQUIREMENTS {
                return Err(format!(
                    "the requirement on {tool:?} has {} conditions; at most {MAX_REQUIREMENTS} are allowed",
                    requirement.conditions.len()
                ));
            }
            let tests = requirement
                .conditions
                .iter()
                .map(|condition| test(condition).map(|t| (condition.pointer.clone(), t)))
                .collect::<Result<Vec<_>, String>>()
                .map_err(|detail| format!("the requirement on {tool:?}: {detail}"))?;
            require.push(tests);
        }
        Ok(Compiled {
            config: config.clone(),
            require,
        })
    }

    fn run(&self, claim: &Claim) -> Vec<Check> {
        let mut checks = vec![self.answer(claim)];
        let (citations, outputs) = self.citations(claim);
        checks.extend(citations);
        checks.extend(self.writes(claim));
        for (requirement, tests) in self.config.require.iter().zip(&self.require) {
            checks.push(required(requirement, tests, &outputs));
        }
        checks
    }

    fn answer(&self, claim: &Claim) -> Check {
        let mut reasons = Vec::new();
        if claim.answer.trim().is_empty() {
            reasons.push("the answer is empty".to_owned());
        }
        if claim.answer.len() > self.config.max_answer_bytes {
            reasons.push(format!(
                "the answer is {} bytes; at most {} are allowed",
                claim.answer.len(),
                self.config.max_answer_bytes
            ));
        }
        rule("answer", reasons, Vec::new())
    }

    /// The citations check (when the answer cites, or must), and the cited outputs.
    fn citations<'c>(&self, claim: &'c Claim) -> (Option<Check>, Vec<Output<'c>>) {
        let mut reasons = Vec::new();
        let mut outputs = Vec::new();
        if claim.evidence.is_empty() {
            if !self.config.require_citations {
                return (None, outputs);
            }
            reasons.push(
                "the answer cites no result: cite the call IDs of the committed results it rests on (no evidence, no success)"
                    .to_owned(),
            );
        }
        for id in &claim.evidence {
            let Some(cited) = claim.cited.iter().find(|c| &c.call_id == id) else {
                reasons.push(format!(
                    "{id:?} is not a call with a committed result in this invocation"
                ));
                continue;
            };
            match &cited.outcome {
                CallOutcome::Output { output_json } => outputs.push(Output {
                    cited,
                    json: output_json,
                }),
                other @ (CallOutcome::Error(_)
                | CallOutcome::Cancelled
                | CallOutcome::NotStarted
                | CallOutcome::Unknown { .. }
                | CallOutcome::InputRequired(_)) => reasons.push(format!(
                    "{id:?} ({}) {}, not an output",
                    cited.tool,
                    not_an_output(other)
                )),
            }
        }
        let evidence = outputs.iter().map(|o| o.cited.call_id.clone()).collect();
        (Some(rule("citations", reasons, evidence)), outputs)
    }

    fn writes(&self, claim: &Claim) -> Option<Check> {
        let allowed: &[EffectState] = match self.config.writes {
            Writes::Unchecked => return None,
            Writes::Committed | Writes::Settled
                if claim
                    .effects
                    .iter()
                    .all(agentloop_effects::Effect::superseded) =>
            {
                return None;
            }
            Writes::Committed => &[EffectState::Committed],
            Writes::Settled => &[EffectState::Committed, EffectState::Rejected],
        };
        let mut reasons = Vec::new();
        let mut evidence = Vec::new();
        for entry in claim.effects.iter().filter(|entry| !entry.superseded()) {
            let state = entry.state;
            if state.is_some_and(|state| allowed.contains(&state)) {
                evidence.push(entry.effect_key.clone());
                continue;
            }
            let detail = if entry.detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", entry.detail)
            };
            reasons.push(format!(
                "the write of call {:?} ({}) is {} in the effect ledger{detail}; an invocation whose writes are not all {} cannot complete",
                entry.call_id,
                entry.tool,
                state_name(state),
                match self.config.writes {
                    Writes::Settled => "settled",
                    Writes::Committed | Writes::Unchecked => "committed",
                },
            ));
        }
        Some(rule("writes", reasons, evidence))
    }
}

/// A cited result that is an output.
struct Output<'c> {
    cited: &'c Cited,
    json: &'c str,
}

fn required(requirement: &Requirement, tests: &[(String, Test)], outputs: &[Output<'_>]) -> Check {
    let name = format!("require:{}", requirement.tool);
    let mut misses = Vec::new();
    for output in outputs.iter().filter(|o| o.cited.tool == requirement.tool) {
        match serde_json::from_str::<serde_json::Value>(output.json) {
            Err(_) => misses.push(format!("{:?}'s output is not JSON", output.cited.call_id)),
            Ok(value) => match tests
                .iter()
                .find_map(|(pointer, t)| failed(&value, pointer, t))
            {
                None => return rule(&name, Vec::new(), vec![output.cited.call_id.clone()]),
                Some(miss) => misses.push(format!("in {:?}, {miss}", output.cited.call_id)),
            },
        }
    }
    let wanted = describe(requirement);
    let reason = if misses.is_empty() {
        format!("the answer must cite {wanted}; it cites none")
    } else {
        format!("the answer must cite {wanted}; {}", misses.join("; "))
    };
    rule(&name, vec![reason], Vec::new())
}

/// Why `value` fails `test` at `pointer`, or `None` when it passes.
fn failed(value: &serde_json::Value, pointer: &str, test: &Test) -> Option<String> {
    let found = value.pointer(pointer);
    match (test, found) {
        (Test::Exists(true), Some(_)) | (Test::Exists(false), None) => None,
        (Test::Exists(true), None) => Some(format!("nothing is at {pointer:?}")),
        (Test::Exists(false), Some(_)) => Some(format!("a value is at {pointer:?}")),
        (Test::Equals(want), Some(got)) if got == want => None,
        (Test::Matches(pattern), Some(serde_json::Value::String(text)))
            if pattern.is_match(text) =>
        {
            None
        }
        (_, None) => Some(format!("nothing is at {pointer:?}")),
        (_, Some(got)) => Some(format!("{pointer:?} is {}", bounded(got))),
    }
}

fn test(condition: &Condition) -> Result<Test, String> {
    let pointer = &condition.pointer;
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Err(format!(
            "pointer {pointer:?} is not a JSON pointer (it starts with '/', or is empty)"
        ));
    }
    match (&condition.equals, condition.exists, &condition.matches) {
        (Some(value), None, None) => Ok(Test::Equals(value.0.clone())),
        (None, Some(exists), None) => Ok(Test::Exists(exists)),
        (None, None, Some(pattern)) => regex::RegexBuilder::new(pattern)
            .size_limit(MAX_REGEX_SIZE)
            .build()
            .map(Test::Matches)
            .map_err(|error| {
                format!("`matches` at {pointer:?} is not a valid expression: {error}")
            }),
        _ => Err(format!(
            "the condition at {pointer:?} needs exactly one of `equals`, `exists` and `matches`"
        )),
    }
}

/// The requirement in words, for the model.
fn describe(requirement: &Requirement) -> String {
    let mut text = format!("a {} result with an output", requirement.tool);
    for (index, condition) in requirement.conditions.iter().enumerate() {
        text.push_str(if index == 0 { " where " } else { " and " });
        let pointer = &condition.pointer;
        match (&condition.equals, condition.exists, &condition.matches) {
            (Some(value), _, _) => text.push_str(&format!("{pointer:?} is {}", bounded(&value.0))),
            (_, Some(true), _) => text.push_str(&format!("{pointer:?} exists")),
            (_, Some(false), _) => text.push_str(&format!("{pointer:?} does not exist")),
            (_, _, Some(pattern)) => text.push_str(&format!("{pointer:?} matches {pattern:?}")),
            (None, None, None) => {}
        }
    }
    text
}

/// A value for a message, cut to a readable length.
fn bounded(value: &serde_json::Value) -> String {
    const MAX: usize = 200;
    let mut text = value.to_string();
    if text.len() > MAX {
        text = format!("{}…", agentloop_proto::prefix(&text, MAX));
    }
    text
}

fn not_an_output(outcome: &CallOutcome) -> String {
    match outcome {
        CallOutcome::Error(error) => format!(
            "ended with an error ({}: {})",
            agentloop_wire::error_type(error.error_type).as_str_name(),
            error.message
        ),
        CallOutcome::Cancelled => "was cancelled".to_owned(),
        CallOutcome::NotStarted => "never started".to_owned(),
        CallOutcome::Unknown { .. } => "has an unknown outcome".to_owned(),
        CallOutcome::InputRequired(_) => "waits for a person's input".to_owned(),
        CallOutcome::Output { .. } => "has no result".to_owned(),
    }
}

fn state_name(state: Option<EffectState>) -> &'static str {
    match state {
        None => "in no known state",
        Some(EffectState::Prepared) => "prepared but never sent",
        Some(EffectState::Dispatched) => "still in flight",
        Some(EffectState::Committed) => "committed",
        Some(EffectState::Rejected) => "rejected",
        Some(EffectState::OutcomeUnknown) => "of unknown outcome",
        Some(EffectState::ReconciliationRequired) => "waiting for an operator to reconcile it",
    }
}

fn rule(name: &str, reasons: Vec<String>, evidence: Vec<String>) -> Check {
    let verdict = if reasons.is_empty() {
        CheckVerdict::Accepted
    } else {
        CheckVerdict::Rejected
    };
    Check {
        name: name.to_owned(),
        kind: CheckKind::Rule,
        verdict,
        reasons,
        evidence,
    }
}
