//! The scripted model: a stable JSON format (`docs/models.md`, "The scripted model") that
//! replays canned decisions, one per turn, so demos and tests run without a provider.
//!
//! Parsing is strict on purpose: a typo in a hand-written script should fail loudly with
//! the turn index and field it concerns, not silently become a different decision.
//! Tool-call arguments are kept as the exact JSON text of the script (`RawValue`), so
//! integers beyond 53 bits and number formatting survive, and arguments that are not an
//! object stay as they are: the engine rejects them, the adapter does not "fix" them.
//!
//! A crate of its own because two services read the format: the orchestrator checks a
//! script when an invocation starts, and the decision service replays it. It is only the
//! format: the model that answers from a script is the decision service's.

#![warn(missing_docs)]

use std::time::Duration;

use agentloop_engine::DecisionBounds;
use serde::Deserialize;
use serde_json::value::RawValue;

/// Largest script text accepted, in bytes (4 MiB, the gRPC message limit).
pub const MAX_SCRIPT_BYTES: usize = 4 * 1024 * 1024;
/// Most turns a script may hold.
pub const MAX_TURNS: usize = 10_000;
/// Longest `delay_ms` a turn may ask for (10 minutes), so a script cannot park a
/// request for ever.
pub const MAX_DELAY_MS: u64 = 10 * 60 * 1000;

/// Why a script was refused. Every variant names where in the script the problem is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// The script is larger than [`MAX_SCRIPT_BYTES`].
    #[error("the script is {bytes} bytes; at most {limit} are allowed")]
    TooLarge {
        /// Size of the script text.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The text is not JSON of the script's shape (bad JSON, unknown key, wrong type,
    /// missing field); `path` is a JSON path such as `$.turns[2].tool_calls[0]`.
    #[error("{path}: {detail}")]
    Malformed {
        /// Where the problem is.
        path: String,
        /// What serde_json reported.
        detail: String,
    },
    /// `turns` is empty: there is nothing to replay.
    #[error("$.turns: a script needs at least one turn")]
    NoTurns,
    /// More than [`MAX_TURNS`] turns.
    #[error("$.turns: the script has {turns} turns; at most {limit} are allowed")]
    TooManyTurns {
        /// Turns in the script.
        turns: usize,
        /// The limit.
        limit: usize,
    },
    /// A turn names no decision kind.
    #[error("$.turns[{index}]: no decision kind; expected exactly one of {KINDS}")]
    NoKind {
        /// 0-based index of the turn.
        index: usize,
    },
    /// A turn names more than one decision kind.
    #[error("$.turns[{index}]: more than one decision kind ({kinds}); expected exactly one")]
    SeveralKinds {
        /// 0-based index of the turn.
        index: usize,
        /// The kinds found, comma-separated.
        kinds: String,
    },
    /// `delay_ms` is over [`MAX_DELAY_MS`].
    #[error("$.turns[{index}].delay_ms: {delay_ms} is over the limit of {limit} ms")]
    DelayTooLong {
        /// 0-based index of the turn.
        index: usize,
        /// The delay asked for.
        delay_ms: u64,
        /// The limit.
        limit: u64,
    },
    /// `evidence` on a turn that is not a final answer: only an answer cites results.
    #[error(
        "$.turns[{index}].evidence: only a final answer carries evidence (use it beside \"final\")"
    )]
    EvidenceWithoutFinal {
        /// 0-based index of the turn.
        index: usize,
    },
    /// More citations than the engine accepts, so the script fails here and not mid-run.
    #[error("$.turns[{index}].evidence: {cited} call IDs; at most {limit} are allowed")]
    TooMuchEvidence {
        /// 0-based index of the turn.
        index: usize,
        /// Call IDs given.
        cited: usize,
        /// The limit.
        limit: usize,
    },
    /// A citation that is empty or blank, which can name no call.
    #[error("$.turns[{index}].evidence[{position}]: the call ID is empty")]
    EmptyEvidenceId {
        /// 0-based index of the turn.
        index: usize,
        /// 0-based position in `evidence`.
        position: usize,
    },
    /// A citation longer than any call ID the engine accepts.
    #[error(
        "$.turns[{index}].evidence[{position}]: the call ID is {bytes} bytes; at most {limit} are allowed"
    )]
    EvidenceIdTooLong {
        /// 0-based index of the turn.
        index: usize,
        /// 0-based position in `evidence`.
        position: usize,
        /// Length of the ID.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
}

const KINDS: &str =
    "tool_calls, final, request_approval, clarification, cannot_continue, model_error, raw";

/// One tool call of a scripted decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedCall {
    /// The call ID, as written (an empty or duplicate ID is passed on for the engine to refuse).
    pub id: String,
    /// The tool name.
    pub name: String,
    /// The arguments exactly as written in the script (any JSON value, not re-encoded).
    pub arguments_json: String,
}

/// What a scripted turn answers. Exhaustive on purpose: the decision service matches
/// every variant, so a new one does not compile until it is handled there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptedDecision {
    /// Run these tool calls.
    ToolCalls(Vec<ScriptedCall>),
    /// A final answer.
    Final {
        /// The answer text.
        answer: String,
        /// The call IDs the answer cites, as written (a repeat is passed on; the engine
        /// drops it).
        evidence: Vec<String>,
    },
    /// Calls that need a human's approval first.
    RequestApproval {
        /// The explanation for the human.
        summary: String,
        /// The calls to approve.
        calls: Vec<ScriptedCall>,
    },
    /// A question for the user.
    Clarification(String),
    /// The model gives up.
    CannotContinue(String),
    /// A simulated provider failure (a gRPC error status, not a decision).
    ModelError(String),
    /// Output that is not a decision; answered as `InvalidOutput`.
    Raw(String),
}

/// Tokens a scripted turn reports as consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedUsage {
    /// Input tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Output tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// What the turn reports it cost, in micro-dollars; absent, the turn has no cost, as
    /// from a model without a price (so scripts can exercise cost budgets).
    #[serde(default)]
    pub cost_micro_usd: Option<u64>,
}

/// One turn of a script: a decision, how long to wait before answering, what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedTurn {
    /// The decision.
    pub decision: ScriptedDecision,
    /// Wait this long before answering (simulates a slow model; cancellable).
    pub delay: Duration,
    /// Reported usage; zero when the script gives none.
    pub usage: ScriptedUsage,
}

/// A parsed, validated script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedModel {
    turns: Vec<ScriptedTurn>,
    repeat_last: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScript<'a> {
    #[serde(borrow)]
    turns: Vec<&'a RawValue>,
    #[serde(default)]
    repeat_last: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTurn<'a> {
    #[serde(default, borrow)]
    tool_calls: Option<Vec<&'a RawValue>>,
    #[serde(default, rename = "final")]
    final_answer: Option<String>,
    #[serde(default)]
    evidence: Option<Vec<String>>,
    #[serde(default, borrow)]
    request_approval: Option<RawApproval<'a>>,
    #[serde(default)]
    clarification: Option<String>,
    #[serde(default)]
    cannot_continue: Option<String>,
    #[serde(default)]
    model_error: Option<String>,
    #[serde(default)]
    raw: Option<String>,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    usage: Option<ScriptedUsage>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApproval<'a> {
    summary: String,
    #[serde(borrow)]
    calls: Vec<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCall<'a> {
    id: String,
    name: String,
    #[serde(borrow)]
    arguments: &'a RawValue,
}

fn malformed(path: String, error: &serde_json::Error) -> ScriptError {
    ScriptError::Malformed {
        path,
        detail: error.to_string(),
    }
}

fn parse_calls(raw: &[&RawValue], path: &str) -> Result<Vec<ScriptedCall>, ScriptError> {
    raw.iter()
        .enumerate()
        .map(|(index, text)| {
            let call: RawCall<'_> = serde_json::from_str(text.get())
                .map_err(|e| malformed(format!("{path}[{index}]"), &e))?;
            Ok(ScriptedCall {
                id: call.id,
                name: call.name,
                arguments_json: call.arguments.get().to_owned(),
            })
        })
        .collect()
}

/// Checks citations against the engine's default bounds: a script that the engine would
/// refuse mid-run is better refused when it is loaded, with the place named.
fn check_evidence(index: usize, evidence: &[String]) -> Result<(), ScriptError> {
    let bounds = DecisionBounds::default();
    if evidence.len() > bounds.max_evidence {
        return Err(ScriptError::TooMuchEvidence {
            index,
            cited: evidence.len(),
            limit: bounds.max_evidence,
        });
    }
    for (position, id) in evidence.iter().enumerate() {
        if id.trim().is_empty() {
            return Err(ScriptError::EmptyEvidenceId { index, position });
        }
        if id.len() > bounds.max_call_id_bytes {
            return Err(ScriptError::EvidenceIdTooLong {
                index,
                position,
                bytes: id.len(),
                limit: bounds.max_call_id_bytes,
            });
        }
    }
    Ok(())
}

fn parse_turn(index: usize, text: &RawValue) -> Result<ScriptedTurn, ScriptError> {
    let path = format!("$.turns[{index}]");
    let raw: RawTurn<'_> =
        serde_json::from_str(text.get()).map_err(|e| malformed(path.clone(), &e))?;
    let mut decisions = Vec::with_capacity(1);
    if let Some(calls) = &raw.tool_calls {
        decisions.push((
            "tool_calls",
            ScriptedDecision::ToolCalls(parse_calls(calls, &format!("{path}.tool_calls"))?),
        ));
    }
    let evidence_given = raw.evidence.is_some();
    if let Some(answer) = raw.final_answer {
        let evidence = raw.evidence.unwrap_or_default();
        check_evidence(index, &evidence)?;
        decisions.push(("final", ScriptedDecision::Final { answer, evidence }));
    }
    if let Some(approval) = raw.request_approval {
        let calls = parse_calls(&approval.calls, &format!("{path}.request_approval.calls"))?;
        decisions.push((
            "request_approval",
            ScriptedDecision::RequestApproval {
                summary: approval.summary,
                calls,
            },
        ));
    }
    if let Some(question) = raw.clarification {
        decisions.push(("clarification", ScriptedDecision::Clarification(question)));
    }
    if let Some(reason) = raw.cannot_continue {
        decisions.push(("cannot_continue", ScriptedDecision::CannotContinue(reason)));
    }
    if let Some(message) = raw.model_error {
        decisions.push(("model_error", ScriptedDecision::ModelError(message)));
    }
    if let Some(text) = raw.raw {
        decisions.push(("raw", ScriptedDecision::Raw(text)));
    }
    let delay_ms = raw.delay_ms.unwrap_or(0);
    if delay_ms > MAX_DELAY_MS {
        return Err(ScriptError::DelayTooLong {
            index,
            delay_ms,
            limit: MAX_DELAY_MS,
        });
    }
    if decisions.len() > 1 {
        let kinds: Vec<&str> = decisions.iter().map(|(kind, _)| *kind).collect();
        return Err(ScriptError::SeveralKinds {
            index,
            kinds: kinds.join(", "),
        });
    }
    if evidence_given && !decisions.iter().any(|(kind, _)| *kind == "final") {
        return Err(ScriptError::EvidenceWithoutFinal { index });
    }
    let Some((_, decision)) = decisions.pop() else {
        return Err(ScriptError::NoKind { index });
    };
    Ok(ScriptedTurn {
        decision,
        delay: Duration::from_millis(delay_ms),
        usage: raw.usage.unwrap_or_default(),
    })
}

/// A script as an invocation keeps it: its text, which goes to a decision service in
/// another process, and the model parsed from it once, which one in the same process
/// replays. Equal by text, so that invocations of the same script can share one.
#[derive(Debug)]
pub struct Script {
    text: String,
    model: ScriptedModel,
}

impl Script {
    /// Parses `text`, keeping it.
    ///
    /// # Errors
    ///
    /// As [`ScriptedModel::parse`].
    pub fn parse(text: String) -> Result<Script, ScriptError> {
        let model = ScriptedModel::parse(&text)?;
        Ok(Script { text, model })
    }

    /// The JSON text, as given.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The model it describes.
    pub fn model(&self) -> &ScriptedModel {
        &self.model
    }
}

impl PartialEq for Script {
    fn eq(&self, other: &Script) -> bool {
        self.text == other.text
    }
}

impl Eq for Script {}

impl std::hash::Hash for Script {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

impl ScriptedModel {
    /// Parses and validates a script.
    ///
    /// # Errors
    ///
    /// A [`ScriptError`] naming the turn and field at fault: too large, malformed JSON,
    /// an unknown key, a wrong type, no turns, too many turns, a turn with no or two
    /// decision kinds, a delay over [`MAX_DELAY_MS`], `evidence` without `final` or
    /// beyond the engine's bounds.
    pub fn parse(text: &str) -> Result<ScriptedModel, ScriptError> {
        if text.len() > MAX_SCRIPT_BYTES {
            return Err(ScriptError::TooLarge {
                bytes: text.len(),
                limit: MAX_SCRIPT_BYTES,
            });
        }
        let raw: RawScript<'_> =
            serde_json::from_str(text).map_err(|e| malformed("$".to_owned(), &e))?;
        if raw.turns.is_empty() {
            return Err(ScriptError::NoTurns);
        }
        if raw.turns.len() > MAX_TURNS {
            return Err(ScriptError::TooManyTurns {
                turns: raw.turns.len(),
                limit: MAX_TURNS,
            });
        }
        let turns = raw
            .turns
            .iter()
            .enumerate()
            .map(|(index, text)| parse_turn(index, text))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ScriptedModel {
            turns,
            repeat_last: raw.repeat_last,
        })
    }

    /// The turn answering turn number `turn` (1-based): `turns[turn - 1]`, or the last
    /// one past the end when `repeat_last` is set; `None` for turn 0 or past the end.
    pub fn turn(&self, turn: u32) -> Option<&ScriptedTurn> {
        let index = usize::try_from(turn).ok()?.checked_sub(1)?;
        match self.turns.get(index) {
            Some(found) => Some(found),
            None if self.repeat_last => self.turns.last(),
            None => None,
        }
    }

    /// The turns, in order.
    pub fn turns(&self) -> &[ScriptedTurn] {
        &self.turns
    }

    /// Whether the last turn repeats past the end.
    pub fn repeat_last(&self) -> bool {
        self.repeat_last
    }
}
