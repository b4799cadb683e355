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

    /// Adds to `cited` the committed results of the calls in `evidence` that the window
    /// holds and `cited` lacks. `Some(seq)` when some are still missing and the log has
    /// events before `seq`, the first the window holds, to look in.
    pub(crate) fn cite(
        &self,
        evidence: &[String],
        cited: &mut Vec<pb::CitedResult>,
    ) -> Option<u64> {
        cite(&self.0.history, evidence, cited);
        let first = self.0.history.first().map_or(1, |event| event.seq);
        (cited.len() < evidence.len() && first > 1).then_some(first)
    }
}

/// Adds to `cited` the results in `events` of the calls in `evidence` that `cited`
/// lacks, the newest first: a model may reuse a call ID in a later turn, and a turn
/// reopened by an approval is committed again with its results.
pub(crate) fn cite(events: &[pb::Event], evidence: &[String], cited: &mut Vec<pb::CitedResult>) {
    for event in events.iter().rev() {
        if cited.len() == evidence.len() {
            return;
        }
        let Some(pb::event::Body::Turn(turn)) = &event.body else {
            continue;
        };
        let calls: &[pb::ToolCall] = match turn.decision.as_ref().and_then(|d| d.kind.as_ref()) {
            Some(pb::decision::Kind::ToolCalls(batch)) => &batch.calls,
            Some(pb::decision::Kind::RequestApproval(request)) => &request.calls,
            _ => continue,
        };
        for result in &turn.results {
            let id = &result.call_id;
            if !evidence.contains(id) || cited.iter().any(|c| &c.call_id == id) {
                continue;
            }
            let call = calls.iter().find(|call| &call.call_id == id);
            cited.push(pb::CitedResult {
                call_id: id.clone(),
                turn: turn.turn,
                tool: call.map(|c| c.tool.clone()).unwrap_or_default(),
                arguments_json: call.map(|c| c.arguments_json.clone()).unwrap_or_default(),
                result: Some(result.clone()),
            });
        }
    }
}
