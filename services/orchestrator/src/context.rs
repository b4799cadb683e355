//! What the model is shown of one invocation, kept by its runner from turn to turn.

use std::sync::Arc;

use agentloop_proto::v1 as pb;
use uuid::Uuid;

use crate::spec::InvocationSpec;

/// Committed events kept to show the model (bounded context; older turns are in the log).
pub(crate) const HISTORY: usize = 16;

/// The model's view of an invocation: its goal, the script of an offline run, and the
/// window of its last [`HISTORY`] committed events.
///
/// It is kept in the one form the decision port reads, a `DecideRequest` behind an
/// `Arc`: a turn changes only its number and the window, an in-process model reads it
/// where it is, and the gRPC client copies it to encode it. The runner reads and changes
/// it only through these methods, so the wire message's fields are this type's business
/// alone. Its `tools` stay empty: they travel apart.
#[derive(Debug)]
pub(crate) struct ModelContext(Arc<pb::DecideRequest>);

impl ModelContext {
    /// The context of invocation `id` whose last committed events are `history` (at most
    /// [`HISTORY`]). The goal and the script, which may be long, move out of `spec`:
    /// the context keeps the one copy.
    pub(crate) fn new(id: Uuid, spec: &mut InvocationSpec, history: Vec<pb::Event>) -> Self {
        ModelContext(Arc::new(pb::DecideRequest {
            invocation_id: id.to_string(),
            turn: 0,
            goal: std::mem::take(&mut spec.goal),
            profile: spec.profile.clone(),
            tools: Vec::new(),
            history,
            context_from_seq: 0,
            summary: String::new(),
            scripted_model_json: spec.script.take().unwrap_or_default(),
        }))
    }

    /// The task, as the caller gave it.
    pub(crate) fn goal(&self) -> &str {
        &self.0.goal
    }

    /// The model's request for `turn`, shared with the context until the next change.
    pub(crate) fn for_turn(&mut self, turn: u32) -> Arc<pb::DecideRequest> {
        let request = Arc::make_mut(&mut self.0);
        request.turn = turn;
        request.context_from_seq = request.history.first().map_or(0, |event| event.seq);
        Arc::clone(&self.0)
    }

    /// Adds newly committed events to the window, dropping the oldest past [`HISTORY`].
    pub(crate) fn committed(&mut self, events: &[pb::Event]) {
        let history = &mut Arc::make_mut(&mut self.0).history;
        for event in events {
            if history.len() == HISTORY {
                history.remove(0);
            }
            history.push(event.clone());
        }
    }

    /// The successful tool results in the window, as `seq:call_id` references.
    pub(crate) fn outputs(&self) -> Vec<String> {
        use pb::tool_result::Outcome;
        let mut refs = Vec::new();
        for event in &self.0.history {
            if let Some(pb::event::Body::Turn(turn)) = &event.body {
                for result in &turn.results {
                    if matches!(result.outcome, Some(Outcome::Output(_))) {
                        refs.push(format!("{}:{}", event.seq, result.call_id));
                    }
                }
            }
        }
        refs
    }
}
