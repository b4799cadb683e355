//! Cassettes: every decision a model gave one invocation, recorded turn by turn with its
//! usage and response ID, and replayed later without calling the model.
//!
//! Each recorded turn carries a digest of what the model was asked: the goal and, in the
//! window of history it was shown, the results of the calls and the humans' replies (not
//! the invocation's ID, sequence numbers or times, which differ from run to run). A replay
//! answers a turn only when the runtime asks the same: when a tool now answers
//! differently, the replay **diverges** and the turn ends `model_error` naming it,
//! instead of going on with decisions made for another history.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use agentloop_engine::Usage;
use agentloop_proto::v1::{ToolDescriptor, event};
use prost::Message as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::model::{Model, ModelError, ModelReply, Proposal, Question, Reads};

/// The cassette format's version.
pub const CASSETTE_VERSION: u32 = 1;
/// Most turns a cassette holds.
pub const MAX_CASSETTE_TURNS: usize = 10_000;
/// Largest cassette file read.
pub const MAX_CASSETTE_BYTES: u64 = 64 * 1024 * 1024;

/// A recorded run of a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cassette {
    /// [`CASSETTE_VERSION`].
    pub version: u32,
    /// The model that was recorded, as `provider:model`.
    pub model: String,
    /// The invocation's goal.
    pub goal: String,
    /// Each turn's decision, in order.
    pub turns: Vec<Recorded>,
}

/// One recorded turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recorded {
    /// The turn.
    pub turn: u32,
    /// The digest (SHA-256, hex) of what the model was asked ([`asked`]).
    pub asked: String,
    /// What the model answered.
    pub reply: Proposal,
    /// What the call consumed.
    pub usage: Usage,
    /// The model that answered, as the provider names it.
    pub model: String,
    /// The provider's response ID.
    #[serde(default)]
    pub response_id: String,
}

impl Cassette {
    /// Reads a cassette file.
    ///
    /// # Errors
    ///
    /// A message naming the file when it cannot be read, is too large, or is not a
    /// cassette of this version.
    pub fn load(path: &Path) -> Result<Cassette, String> {
        let fail = |why: String| format!("cassette {}: {why}", path.display());
        let size = std::fs::metadata(path)
            .map_err(|e| fail(e.to_string()))?
            .len();
        if size > MAX_CASSETTE_BYTES {
            return Err(fail(format!(
                "{size} bytes, more than {MAX_CASSETTE_BYTES}"
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let cassette: Cassette = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
        if cassette.version != CASSETTE_VERSION {
            return Err(fail(format!(
                "version {}, this build reads {CASSETTE_VERSION}",
                cassette.version
            )));
        }
        if cassette.turns.len() > MAX_CASSETTE_TURNS {
            return Err(fail(format!("more than {MAX_CASSETTE_TURNS} turns")));
        }
        Ok(cassette)
    }
}

/// The digest of what `question` asks beside its IDs and times: its goal, and in its
/// window the results of the calls and the humans' replies, each with its turn.
pub fn asked(question: &Question<'_>) -> String {
    let mut digest = Sha256::new();
    digest.update(question.goal.as_bytes());
    for event in question.history {
        match &event.body {
            Some(event::Body::Turn(turn) | event::Body::BatchStarted(turn)) => {
                digest.update(b"results");
                digest.update(turn.turn.to_be_bytes());
                for result in &turn.results {
                    digest.update(result.encode_to_vec());
                }
            }
            Some(event::Body::ApprovalResolved(resolved)) => {
                digest.update(b"approval");
                digest.update(resolved.encode_to_vec());
            }
            Some(event::Body::ClarificationAnswered(answered)) => {
                digest.update(b"answer");
                digest.update(answered.encode_to_vec());
            }
            Some(event::Body::Ended(_)) | None => {}
        }
    }
    hex::encode(digest.finalize())
}

/// A model that records every reply of another into cassettes: one file
/// (`run --record`), or one file per invocation in a folder (the decision service's
/// `record_dir`). A cassette is rewritten after each turn, so a crash keeps the turns
/// recorded so far. The file of `run --record` starts afresh with the recording; an
/// invocation's file in a folder goes on where it is (an invocation resumed on a
/// restarted service), and a turn asked again (a repair) is recorded again.
#[derive(Debug)]
pub struct Recording {
    inner: Arc<dyn Model>,
    destination: Destination,
    /// One write at a time; whether this recording has written its file yet.
    writing: Mutex<bool>,
}

/// Where a [`Recording`] writes.
#[derive(Debug)]
enum Destination {
    File(PathBuf),
    Folder(PathBuf),
}

impl Recording {
    /// Records `inner` into the cassette `path` (one invocation).
    pub fn new(inner: Arc<dyn Model>, path: PathBuf) -> Recording {
        Recording {
            inner,
            destination: Destination::File(path),
            writing: Mutex::new(false),
        }
    }

    /// Records `inner` into `folder`, the cassette of invocation `ID` as
    /// `ID.cassette.json`.
    pub fn into_folder(inner: Arc<dyn Model>, folder: PathBuf) -> Recording {
        Recording {
            inner,
            destination: Destination::Folder(folder),
            writing: Mutex::new(false),
        }
    }

    fn path(&self, invocation_id: &str) -> Result<PathBuf, ModelError> {
        match &self.destination {
            Destination::File(path) => Ok(path.clone()),
            Destination::Folder(folder) => {
                // An ID becomes a file name: nothing that could leave the folder.
                let plain = !invocation_id.is_empty()
                    && invocation_id
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
                if !plain {
                    return Err(ModelError::InvalidRequest(
                        "the invocation ID cannot name a cassette file".to_owned(),
                    ));
                }
                std::fs::create_dir_all(folder).map_err(|e| {
                    ModelError::Provider(format!("cannot record into {}: {e}", folder.display()))
                })?;
                Ok(folder.join(format!("{invocation_id}.cassette.json")))
            }
        }
    }

    fn keep(&self, question: &Question<'_>, reply: &ModelReply) -> Result<(), ModelError> {
        let mut written = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let path = self.path(question.invocation_id)?;
        let failed =
            |e: String| ModelError::Provider(format!("cannot record into {}: {e}", path.display()));
        let afresh = match self.destination {
            Destination::File(_) => !*written,
            Destination::Folder(_) => !path.exists(),
        };
        let mut cassette = if afresh {
            Cassette {
                version: CASSETTE_VERSION,
                model: format!("{}:{}", self.inner.provider(), self.inner.request_model()),
                goal: question.goal.to_owned(),
                turns: Vec::new(),
            }
        } else {
            Cassette::load(&path).map_err(failed)?
        };
        if cassette.turns.len() >= MAX_CASSETTE_TURNS {
            return Err(failed(format!(
                "it holds {MAX_CASSETTE_TURNS} turns already"
            )));
        }
        cassette.turns.push(Recorded {
            turn: question.turn,
            asked: asked(question),
            reply: reply.proposal.clone(),
            usage: reply.usage,
            model: reply.model.clone(),
            response_id: reply.response_id.clone(),
        });
        let text = serde_json::to_string_pretty(&cassette).map_err(|e| failed(e.to_string()))?;
        let partial = path.with_extension("partial");
        std::fs::write(&partial, text)
            .and_then(|()| std::fs::rename(&partial, &path))
            .map_err(|e| failed(e.to_string()))?;
        *written = true;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Model for Recording {
    async fn decide_with(
        &self,
        question: &Question<'_>,
        tools: &[ToolDescriptor],
    ) -> Result<ModelReply, ModelError> {
        let reply = self.inner.decide_with(question, tools).await?;
        self.keep(question, &reply)?;
        Ok(reply)
    }

    /// The whole window: what is new in it is digested.
    fn reads(&self) -> Reads {
        Reads::ALL
    }

    fn provider(&self) -> &'static str {
        self.inner.provider()
    }

    fn request_model(&self) -> &str {
        self.inner.request_model()
    }
}

/// A model that answers from a cassette, never calling one.
#[derive(Debug)]
pub struct Replaying {
    cassette: Cassette,
}

impl Replaying {
    /// Replays `cassette`.
    pub fn new(cassette: Cassette) -> Replaying {
        Replaying { cassette }
    }
}

#[async_trait::async_trait]
impl Model for Replaying {
    async fn decide_with(
        &self,
        question: &Question<'_>,
        _tools: &[ToolDescriptor],
    ) -> Result<ModelReply, ModelError> {
        let turn = question.turn;
        let mut of_turn = self
            .cassette
            .turns
            .iter()
            .filter(|recorded| recorded.turn == turn)
            .peekable();
        if of_turn.peek().is_none() {
            return Err(ModelError::Diverged(format!(
                "turn {turn}: the cassette has no decision for it (it recorded {} turns)",
                self.cassette.turns.len()
            )));
        }
        // A turn asked again (a repair) was recorded again, with what it was asked then.
        let asked = asked(question);
        let recorded = of_turn
            .find(|recorded| recorded.asked == asked)
            .ok_or_else(|| {
                ModelError::Diverged(format!(
                    "turn {turn}: the model is asked something else than when it was recorded (a goal, a tool's result or a human's reply differs)"
                ))
            })?;
        Ok(ModelReply {
            proposal: recorded.reply.clone(),
            usage: recorded.usage,
            model: recorded.model.clone(),
            response_id: recorded.response_id.clone(),
        })
    }

    /// The whole window: what is new in it is compared with the recording.
    fn reads(&self) -> Reads {
        Reads::ALL
    }

    fn provider(&self) -> &'static str {
        "cassette"
    }

    fn request_model(&self) -> &str {
        &self.cassette.model
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentloop_proto::v1::{Event, ToolOutput, ToolResult, TurnCommitted, tool_result};

    fn question<'a>(goal: &'a str, invocation_id: &'a str, history: &'a [Event]) -> Question<'a> {
        Question {
            invocation_id,
            turn: 2,
            goal,
            summary: "",
            context_from_seq: 1,
            history,
        }
    }

    fn looked_up(invocation_id: &str, at: i64, value: &str) -> Vec<Event> {
        vec![Event {
            invocation_id: invocation_id.to_owned(),
            seq: 1,
            committed_at: Some(prost_types::Timestamp {
                seconds: at,
                nanos: 0,
            }),
            body: Some(event::Body::Turn(TurnCommitted {
                turn: 1,
                results: vec![ToolResult {
                    call_id: "a".to_owned(),
                    outcome: Some(tool_result::Outcome::Output(ToolOutput {
                        output_json: format!("{{\"value\":\"{value}\"}}"),
                        receipt: String::new(),
                    })),
                }],
                ..Default::default()
            })),
        }]
    }

    /// Answers every question with the same final answer.
    #[derive(Debug)]
    struct Answers;

    #[async_trait::async_trait]
    impl Model for Answers {
        async fn decide_with(
            &self,
            question: &Question<'_>,
            _tools: &[ToolDescriptor],
        ) -> Result<ModelReply, ModelError> {
            Ok(ModelReply {
                proposal: Proposal::Decision(agentloop_engine::ProposedDecision::Final {
                    answer: format!("turn {}", question.turn),
                    evidence: Vec::new(),
                }),
                usage: Usage::default(),
                model: "answers-1".to_owned(),
                response_id: format!("r{}", question.turn),
            })
        }

        fn provider(&self) -> &'static str {
            "test"
        }

        fn request_model(&self) -> &str {
            "answers"
        }
    }

    /// The service's folder holds one cassette per invocation, which goes on where it is
    /// (a turn asked again included), and no ID names a file outside it; the file of
    /// `run --record` starts afresh.
    #[tokio::test]
    async fn a_folder_records_a_cassette_per_invocation() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("cassettes");
        let recording = Recording::into_folder(Arc::new(Answers), folder.clone());
        for (id, turns) in [("inv-a", 2), ("inv-b", 1), ("inv-a", 1)] {
            for turn in 1..=turns {
                let mut asking = question("goal", id, &[]);
                asking.turn = turn;
                recording.decide_with(&asking, &[]).await.unwrap();
            }
        }
        let a = Cassette::load(&folder.join("inv-a.cassette.json")).unwrap();
        let turns: Vec<u32> = a.turns.iter().map(|recorded| recorded.turn).collect();
        assert_eq!(turns, [1, 2, 1], "turn 1 asked again is recorded again");
        assert_eq!(a.model, "test:answers");
        let b = Cassette::load(&folder.join("inv-b.cassette.json")).unwrap();
        assert_eq!(b.turns[0].response_id, "r1");
        let mut escaping = question("goal", "../elsewhere", &[]);
        escaping.turn = 1;
        assert!(matches!(
            recording.decide_with(&escaping, &[]).await,
            Err(ModelError::InvalidRequest(_))
        ));
        assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 2);

        let file = dir.path().join("one.json");
        std::fs::write(&file, "an older recording").unwrap();
        let recording = Recording::new(Arc::new(Answers), file.clone());
        for turn in [1, 1, 2] {
            let mut asking = question("goal", "inv-c", &[]);
            asking.turn = turn;
            recording.decide_with(&asking, &[]).await.unwrap();
        }
        assert_eq!(Cassette::load(&file).unwrap().turns.len(), 3);
    }

    /// Another run of the same history asks the same; another result or goal does not.
    #[test]
    fn the_digest_ignores_ids_and_times_and_sees_results_and_goals() {
        let first = looked_up("inv-1", 1, "active");
        let again = looked_up("inv-2", 99, "active");
        let other = looked_up("inv-1", 1, "closed");
        let asked_first = asked(&question("check", "inv-1", &first));
        assert_eq!(asked_first, asked(&question("check", "inv-2", &again)));
        assert_ne!(asked_first, asked(&question("check", "inv-1", &other)));
        assert_ne!(asked_first, asked(&question("check it", "inv-1", &first)));
    }
}
