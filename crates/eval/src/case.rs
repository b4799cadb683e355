//! A case file: one task, how to run it, and what its run must show.
//!
//! Paths inside a case (a script file, tools, policies, acceptance rules) are relative to
//! the case file, so a suite can be moved as a folder. Unknown keys are refused: a
//! misspelt expectation must fail loudly, not pass by checking nothing.

use std::path::{Path, PathBuf};

use agentloop_engine::TerminalReason;
use regex::Regex;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The largest case file read, and the largest script file it names.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// The most runs of one case (`repeat`).
pub const MAX_REPEAT: u32 = 100;
/// The most case files in one suite.
pub const MAX_CASES: usize = 10_000;

/// One evaluation case, as written in its file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "agentloop eval case")]
pub struct Case {
    /// Names the case in reports; unique within a suite.
    pub name: String,
    /// Groups for the aggregate's success rate by tag.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The invocation's goal.
    pub goal: String,
    /// The scripted model: its decisions inline (`{"turns": [...]}`), or the path of a
    /// script file. The format is the one `agentloop run --script` reads.
    #[serde(default)]
    pub script: Option<Script>,
    /// Instead of a script: a cassette that `agentloop run --record` wrote, replayed
    /// without calling the model.
    #[serde(default)]
    pub cassette: Option<PathBuf>,
    /// Instead of a script: a real model, `openai:MODEL` or `anthropic:MODEL`, reached
    /// as `agentloop run --model` reaches it (its base URL and key from the usual
    /// variables).
    #[serde(default)]
    pub model: Option<String>,
    /// The price of `model` in US dollars per million input and output tokens, so its
    /// runs have a cost: `[2.5, 10]`.
    #[serde(default)]
    pub price: Option<[f64; 2]>,
    /// A tools configuration (TOML) for the run; without it, the demo executor's tools.
    #[serde(default)]
    pub tools: Option<PathBuf>,
    /// Cedar policy files authorizing every call of the run; without them, authorization
    /// is off.
    #[serde(default)]
    pub policies: Vec<PathBuf>,
    /// Acceptance rules (TOML) that the final answer is verified against.
    #[serde(default)]
    pub acceptance: Option<PathBuf>,
    /// Budget overrides for the run.
    #[serde(default)]
    pub budgets: Budgets,
    /// How many times the case runs; each run is judged on its own.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 100))]
    pub repeat: u32,
    /// The replies of humans, in order, each given when the run next waits for one.
    #[serde(default)]
    pub humans: Vec<Human>,
    /// Cancels the run, as a caller would, at the moment given.
    #[serde(default)]
    pub cancel: Option<Cancel>,
    /// Faults the embedded stack injects.
    #[serde(default)]
    pub faults: Faults,
    /// What the run must show.
    #[serde(default)]
    pub expect: Expect,
}

fn one() -> u32 {
    1
}

/// The scripted model.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Script {
    /// A script file, relative to the case file.
    File(PathBuf),
    /// The script itself.
    Inline(Map<String, Value>),
}

/// Budget overrides; what is not given is the profile's.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Budgets {
    /// Turns.
    pub max_steps: Option<u32>,
    /// Tool calls.
    pub max_tool_calls: Option<u32>,
    /// How often the same plan may run in a row (0 turns the check off).
    pub max_repeated_plan: Option<u32>,
    /// The wall-clock budget, in milliseconds.
    pub deadline_ms: Option<u64>,
    /// The cost budget, in US dollars.
    pub max_cost_usd: Option<f64>,
}

/// A human's reply to the run's next wait.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Human {
    /// Approves the proposal the run waits on.
    Approve {
        /// Kept with the verdict.
        #[serde(default)]
        comment: String,
    },
    /// Denies it.
    Deny {
        /// Kept with the verdict; the model reads it.
        #[serde(default)]
        comment: String,
    },
    /// Answers the question the run waits on.
    Answer(String),
}

/// Faults the embedded stack injects into a run.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// What the demo executor's `transfer` does to every call.
    pub transfer: Option<TransferFault>,
    /// A crash of the runtime, followed by a resume on a new one over the same data.
    pub crash: Option<Crash>,
}

/// When the runtime crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Crash {
    /// Once the demo executor has applied a write and before the runtime heard back, so
    /// before the turn is committed: the resumed run must find the write applied and not
    /// send it again.
    AfterWriteSent,
}

/// A fault of the demo executor's `transfer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransferFault {
    /// It fails (UNAVAILABLE) before applying anything.
    FailsBeforeApply,
    /// It applies the write, then its reply is lost (UNAVAILABLE): the runtime cannot
    /// know the write happened until it asks the executor.
    LosesReply,
    /// It applies the write and holds its reply past the call's timeout.
    TimesOut,
}

/// When a case cancels its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Cancel {
    /// As soon as the orchestrator reports a call in flight: the cancel reaches a
    /// running tool.
    WhileCallsRun,
}

/// What a run must show. Every expectation given is checked; none given passes any run
/// that ends.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// The terminal reason: one, or any of a list.
    pub reason: Option<Reasons>,
    /// The tool calls the model made.
    pub trajectory: Option<Trajectory>,
    /// The writes applied exactly once by the effect ledger, and no others; each
    /// matched as a trajectory's call is.
    pub effects: Option<Vec<ExpectedCall>>,
    /// The final answer.
    pub answer: Option<AnswerCheck>,
    /// The calls the final answer must cite as its evidence: each entry a call ID, or a
    /// tool name that a cited call used.
    pub evidence: Option<Vec<String>>,
    /// At most this many turns.
    pub max_turns: Option<u32>,
    /// At most this many tool calls.
    pub max_tool_calls: Option<u32>,
    /// At most this many tokens, input and output together.
    pub max_tokens: Option<u64>,
    /// At most this cost, in US dollars.
    pub max_cost_usd: Option<f64>,
    /// At most this long from the start request to the end, in milliseconds.
    pub max_duration_ms: Option<u64>,
}

/// One terminal reason, or a list of acceptable ones.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Reasons {
    /// Exactly this one.
    One(TerminalReasonName),
    /// Any of these.
    Any(Vec<TerminalReasonName>),
}

impl Reasons {
    /// The acceptable reasons.
    pub fn all(&self) -> Vec<TerminalReason> {
        match self {
            Reasons::One(reason) => vec![reason.0],
            Reasons::Any(reasons) => reasons.iter().map(|reason| reason.0).collect(),
        }
    }
}

/// A terminal reason by its name (`completed`, `approval_required`, ...).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(transparent)]
pub struct TerminalReasonName(pub TerminalReason);

impl JsonSchema for TerminalReasonName {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "TerminalReason".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names: Vec<String> = TerminalReason::ALL
            .iter()
            .map(ToString::to_string)
            .collect();
        schemars::json_schema!({"type": "string", "enum": names})
    }
}

/// The calls expected of the model, and how they are compared with those it made.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Trajectory {
    /// How the two lists are compared.
    #[serde(rename = "match")]
    pub mode: Match,
    /// The expected calls.
    pub calls: Vec<ExpectedCall>,
}

/// How expected calls are compared with the calls made, in the order the model
/// proposed them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Match {
    /// The same calls in the same order, and no others.
    Exact,
    /// The expected calls in this order, other calls allowed between them.
    InOrder,
    /// The same calls in any order, and no others.
    AnyOrder,
    /// Every call made is one of the expected, any number of times (some expected may
    /// not be made).
    Subset,
    /// Every expected call is made, each by a call of its own, in any order (others may
    /// be made too).
    Superset,
}

/// An expected call: its tool, and the arguments that matter. Arguments are compared as
/// JSON, key by key, and only the keys given (in nested objects too).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpectedCall {
    /// The tool.
    pub name: String,
    /// The arguments that must be as given.
    #[serde(default)]
    pub arguments: Map<String, Value>,
}

/// What the final answer must say.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum AnswerCheck {
    /// The answer contains this text.
    Contains(String),
    /// The answer matches this regular expression (Rust `regex` syntax).
    Matches(String),
}

/// A case read from its file, checked and ready to run.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The case file.
    pub path: PathBuf,
    /// The case, its paths resolved against the case file's folder.
    pub case: Case,
    /// The script's JSON text; empty for a cassette.
    pub script: String,
    /// `expect.answer`'s regular expression, compiled.
    pub answer_pattern: Option<Regex>,
}

/// A case that cannot be run, and why.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    /// The file cannot be read.
    #[error("{path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The file is not a valid case.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// Reads `path`, refusing files over [`MAX_FILE_BYTES`] before reading them.
fn read_bounded(path: &Path) -> Result<String, CaseError> {
    let read = |message: String| CaseError::Read {
        path: path.to_owned(),
        message,
    };
    let size = std::fs::metadata(path)
        .map_err(|e| read(e.to_string()))?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(read(format!(
            "{size} bytes, more than the {MAX_FILE_BYTES} a case may have"
        )));
    }
    std::fs::read_to_string(path).map_err(|e| read(e.to_string()))
}

/// Reads and checks the case in `path`.
///
/// # Errors
///
/// [`CaseError`] when the file cannot be read or is not a valid case.
pub fn load(path: &Path) -> Result<Loaded, CaseError> {
    let text = read_bounded(path)?;
    let invalid = |message: String| CaseError::Invalid {
        path: path.to_owned(),
        message,
    };
    let mut case: Case = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    if case.name.trim().is_empty() {
        return Err(invalid("`name` is empty".to_owned()));
    }
    if case.repeat == 0 || case.repeat > MAX_REPEAT {
        return Err(invalid(format!(
            "`repeat` is {}, not within 1 to {MAX_REPEAT}",
            case.repeat
        )));
    }
    for (what, usd) in [
        ("budgets.max_cost_usd", case.budgets.max_cost_usd),
        ("expect.max_cost_usd", case.expect.max_cost_usd),
    ] {
        if let Some(usd) = usd
            && micro_usd(usd).is_none()
        {
            return Err(invalid(format!(
                "`{what}` is {usd}, not an amount in dollars"
            )));
        }
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let script = match (&case.script, &case.cassette, &case.model) {
        (Some(Script::Inline(script)), None, None) => Value::Object(script.clone()).to_string(),
        (Some(Script::File(file)), None, None) => read_bounded(&base.join(file))?,
        (None, Some(_), None) | (None, None, Some(_)) => String::new(),
        _ => {
            return Err(invalid(
                "give exactly one of `script`, `cassette` and `model`".to_owned(),
            ));
        }
    };
    if case.price.is_some() && case.model.is_none() {
        return Err(invalid("`price` is the price of `model`".to_owned()));
    }
    case.cassette = case.cassette.map(|cassette| base.join(cassette));
    case.tools = case.tools.map(|tools| base.join(tools));
    case.acceptance = case.acceptance.map(|rules| base.join(rules));
    case.policies = case.policies.iter().map(|file| base.join(file)).collect();
    let answer_pattern = match &case.expect.answer {
        Some(AnswerCheck::Matches(pattern)) => Some(
            Regex::new(pattern).map_err(|e| invalid(format!("`expect.answer.matches`: {e}")))?,
        ),
        Some(AnswerCheck::Contains(_)) | None => None,
    };
    Ok(Loaded {
        path: path.to_owned(),
        case,
        script,
        answer_pattern,
    })
}

/// Every case file `paths` name: a file as given, a folder's `.json` files (in its
/// subfolders too), each folder in name order.
///
/// # Errors
///
/// [`CaseError::Read`] for a path that cannot be read, or a suite of more than
/// [`MAX_CASES`] files.
pub fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CaseError> {
    let mut found = Vec::new();
    for path in paths {
        collect(path, &mut found)?;
    }
    Ok(found)
}

fn collect(path: &Path, found: &mut Vec<PathBuf>) -> Result<(), CaseError> {
    let read = |message: String| CaseError::Read {
        path: path.to_owned(),
        message,
    };
    if !path.is_dir() {
        push(found, path.to_owned()).map_err(read)?;
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| read(e.to_string()))?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<_, _>>()
        .map_err(|e| read(e.to_string()))?;
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            collect(&entry, found)?;
        } else if entry
            .extension()
            .is_some_and(|extension| extension == "json")
            && !is_script(&entry)
        {
            push(found, entry).map_err(read)?;
        }
    }
    Ok(())
}

/// A folder's script files (`*.script.json`) are what its cases name, not cases.
fn is_script(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.ends_with(".script.json"))
}

fn push(found: &mut Vec<PathBuf>, path: PathBuf) -> Result<(), String> {
    if found.len() >= MAX_CASES {
        return Err(format!("more than {MAX_CASES} case files"));
    }
    found.push(path);
    Ok(())
}

/// Dollars as micro-dollars, if they are an amount (finite, not negative, at most a
/// billion).
pub fn micro_usd(usd: f64) -> Option<u64> {
    if usd.is_finite() && (0.0..=1e9).contains(&usd) {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "checked above: finite, not negative, at most 1e15 micro-dollars"
        )]
        Some((usd * 1e6).round() as u64)
    } else {
        None
    }
}

/// The JSON Schema of a case file, which `agentloop eval --schema` prints.
pub fn schema() -> Value {
    serde_json::to_value(schemars::schema_for!(Case)).unwrap_or(Value::Null)
}
