//! The workload's model: two lookups a turn, then an answer from the last results; and
//! the same decisions as a script, for a decision service in a process of its own.

use std::sync::Arc;

use crate::{KEYS, LOOKUP};
use agentloop_decision::{Model, ModelError, ModelReply, Proposal, Question, Reads};
use agentloop_proto::v1 as pb;
use tokio::sync::watch;

/// Holds first-turn decisions until released, counting the ones waiting.
#[derive(Debug)]
pub(crate) struct Gate {
    pub(crate) waiting: watch::Sender<u64>,
    pub(crate) released: watch::Sender<bool>,
}

impl Gate {
    pub(crate) fn new() -> Gate {
        Gate {
            waiting: watch::Sender::new(0),
            released: watch::Sender::new(false),
        }
    }

    pub(crate) async fn pass(&self) {
        let mut released = self.released.subscribe();
        self.waiting.send_modify(|n| *n += 1);
        // An error means the gate is gone, which only happens at shutdown.
        let _ = released.wait_for(|open| *open).await;
    }
}

/// The standard workload's model: two lookups per turn, then an answer from the results.
#[derive(Debug)]
pub(crate) struct BenchModel {
    pub(crate) turns: u32,
    pub(crate) gate: Option<Arc<Gate>>,
}

/// The keys turn `turn` looks up: the next two, so consecutive plans always differ.
pub(crate) fn keys_of(turn: u32) -> [(&'static str, &'static str); 2] {
    let first = (turn as usize * 2) % KEYS.len();
    [KEYS[first], KEYS[(first + 1) % KEYS.len()]]
}

/// The calls of turn `turn` (before the last): call IDs unique per turn, and the keys.
pub(crate) fn calls_of(turn: u32) -> [(String, &'static str); 2] {
    let [(first, _), (second, _)] = keys_of(turn);
    [
        (format!("call-{turn}-a"), first),
        (format!("call-{turn}-b"), second),
    ]
}

/// The calls the answer of an invocation of `turns` turns cites: its last lookups.
pub(crate) fn evidence_of(turns: u32) -> Vec<String> {
    match turns {
        0 | 1 => Vec::new(),
        _ => calls_of(turns - 1).into_iter().map(|(id, _)| id).collect(),
    }
}

/// The workload's decisions as a scripted model (the format of `docs/models.md`), for
/// a decision service in a process of its own.
pub(crate) fn script(turns: u32) -> String {
    let mut decisions: Vec<serde_json::Value> = (1..turns)
        .map(|turn| {
            let calls: Vec<_> = calls_of(turn)
                .into_iter()
                .map(|(id, key)| {
                    serde_json::json!({"id": id, "name": LOOKUP, "arguments": {"key": key}})
                })
                .collect();
            serde_json::json!({ "tool_calls": calls })
        })
        .collect();
    decisions.push(serde_json::json!({
        "final": expected_answer(turns),
        "evidence": evidence_of(turns),
    }));
    serde_json::json!({ "turns": decisions }).to_string()
}

/// The answer of an invocation of `turns` turns: what its last lookups returned.
pub(crate) fn expected_answer(turns: u32) -> String {
    match turns {
        0 | 1 => "nothing was looked up".to_owned(),
        _ => keys_of(turns - 1)
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

#[derive(serde::Deserialize)]
pub(crate) struct LookupOutput {
    pub(crate) key: String,
    pub(crate) value: String,
}

/// "key=value; key=value" from the results of the newest turn in the history.
pub(crate) fn answer_from(history: &[pb::Event]) -> String {
    use pb::tool_result::Outcome;
    let last = history.iter().rev().find_map(|event| match &event.body {
        Some(pb::event::Body::Turn(turn)) if !turn.results.is_empty() => Some(turn),
        Some(_) | None => None,
    });
    let Some(turn) = last else {
        return expected_answer(1);
    };
    turn.results
        .iter()
        .map(|result| match &result.outcome {
            Some(Outcome::Output(output)) => {
                match serde_json::from_str::<LookupOutput>(&output.output_json) {
                    Ok(found) => format!("{}={}", found.key, found.value),
                    Err(_) => format!("{}=?", result.call_id),
                }
            }
            Some(_) | None => format!("{}=failed", result.call_id),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[async_trait::async_trait]
impl Model for BenchModel {
    /// The last turn, whose results the answer names; not the tools.
    fn reads(&self) -> Reads {
        Reads {
            history: 1,
            tools: false,
        }
    }

    fn provider(&self) -> &'static str {
        "bench"
    }

    fn request_model(&self) -> &str {
        "bench"
    }

    async fn decide_with(
        &self,
        request: &Question<'_>,
        _tools: &[pb::ToolDescriptor],
    ) -> Result<ModelReply, ModelError> {
        use agentloop_engine::{ProposedCall, ProposedDecision};
        if request.turn == 1
            && let Some(gate) = &self.gate
        {
            gate.pass().await;
        }
        let decision = if request.turn < self.turns {
            let calls = calls_of(request.turn)
                .into_iter()
                .map(|(call_id, key)| ProposedCall {
                    call_id,
                    tool: LOOKUP.to_owned(),
                    arguments_json: format!(r#"{{"key":"{key}"}}"#),
                })
                .collect();
            ProposedDecision::ToolCalls { calls }
        } else {
            // Citing the last turn's lookups (if any), which the acceptance rules check.
            ProposedDecision::Final {
                answer: answer_from(request.history),
                evidence: evidence_of(request.turn),
            }
        };
        Ok(ModelReply {
            proposal: Proposal::Decision(decision),
            usage: agentloop_engine::Usage::default(),
            model: "bench".to_owned(),
            response_id: String::new(),
        })
    }
}
