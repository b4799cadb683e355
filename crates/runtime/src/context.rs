//! What the model is shown of one invocation, kept by its runner from turn to turn.

use std::sync::Arc;

use agentloop_engine::{EventBody, ProposedDecision};
use agentloop_script::Script;
use agentloop_store::{EventStore, StoreError, StoredEvent};
use uuid::Uuid;

use crate::intern::Interner;
use crate::ports::Cited;
use crate::spec::InvocationSpec;

/// Committed events kept to show the model (bounded context; older turns are in the log).
pub(crate) const HISTORY: usize = 16;

/// The model's view of an invocation: its goal, the script of an offline run, and the
/// window of its last [`HISTORY`] committed events, as the engine committed them.
///
/// Each event is behind an `Arc` of its own, which the hub's live channel shares: a
/// committed event is held once, however many watchers it reaches, and the window's
/// room for more is pointers, not 328-byte events.
///
/// Behind one `Arc`, which the model call in flight shares: a commit changes the window
/// only after the turn's decision came back, so the window is never copied.
#[derive(Debug, Clone)]
pub(crate) struct ModelContext(Arc<Window>);

#[derive(Debug, Clone)]
struct Window {
    goal: String,
    /// The script of an offline run, parsed, or why it does not parse (a script stored
    /// by a build whose parser was less strict): its decisions then fail.
    script: Option<Result<Arc<Script>, String>>,
    history: Vec<Arc<StoredEvent>>,
}

impl ModelContext {
    /// The context of an invocation whose last committed events are `history` (at most
    /// [`HISTORY`]). The goal and the script, which may be long, move out of `spec`:
    /// the context keeps the goal, and the script parsed, shared through `scripts` with
    /// the invocations of the same script.
    pub(crate) fn new(
        spec: &mut InvocationSpec,
        history: Vec<StoredEvent>,
        scripts: &Interner<Script>,
    ) -> Self {
        let script = spec.script.take().map(|text| {
            Script::parse(text)
                .map(|script| scripts.intern(script))
                .map_err(|error| error.to_string())
        });
        ModelContext(Arc::new(Window {
            goal: std::mem::take(&mut spec.goal),
            script,
            history: history.into_iter().map(Arc::new).collect(),
        }))
    }

    /// The task, as the caller gave it.
    pub(crate) fn goal(&self) -> &str {
        &self.0.goal
    }

    /// The scripted model of an offline run, if it has one; `Err` with why when its
    /// script does not parse.
    pub(crate) fn script(&self) -> Result<Option<&Script>, &str> {
        match &self.0.script {
            None => Ok(None),
            Some(Ok(script)) => Ok(Some(script)),
            Some(Err(why)) => Err(why),
        }
    }

    /// The window, oldest first.
    pub(crate) fn history(&self) -> &[Arc<StoredEvent>] {
        &self.0.history
    }

    /// Adds newly committed events to the window, dropping the oldest past [`HISTORY`].
    pub(crate) fn committed(&mut self, events: impl IntoIterator<Item = Arc<StoredEvent>>) {
        let history = &mut Arc::make_mut(&mut self.0).history;
        for event in events {
            if history.len() == HISTORY {
                history.remove(0);
            }
            history.push(event);
        }
    }

    /// Adds to `cited` the committed results of the calls in `evidence` that the window
    /// holds and `cited` lacks. `Some(seq)` when some are still missing and the log has
    /// events before `seq`, the first the window holds, to look in.
    pub(crate) fn cite(&self, evidence: &[String], cited: &mut Vec<Cited>) -> Option<u64> {
        cite(self.0.history.iter().map(AsRef::as_ref), evidence, cited);
        let first = self.0.history.first().map_or(1, |stored| stored.event.seq);
        (cited.len() < evidence.len() && first > 1).then_some(first)
    }
}

/// Events read from the store per page.
const LOG_PAGE: u32 = 256;

/// The committed events of `id` before seq `before`, in order, read in pages; `None`
/// once more than `limit` were read (what the caller can hold is bounded).
pub(crate) async fn read_log(
    store: &dyn EventStore,
    id: Uuid,
    before: u64,
    limit: usize,
) -> Result<Option<Vec<StoredEvent>>, StoreError> {
    let mut events = Vec::new();
    let mut from = 1;
    while from < before {
        let page = store.events(id, from, LOG_PAGE).await?;
        let Some(last) = page.last().map(|stored| stored.event.seq) else {
            break;
        };
        events.extend(page.into_iter().filter(|stored| stored.event.seq < before));
        if events.len() > limit {
            return Ok(None);
        }
        from = last + 1;
    }
    Ok(Some(events))
}

/// Adds to `cited` the results in `events` of the calls in `evidence` that `cited`
/// lacks, the newest first: a model may reuse a call ID in a later turn, and a turn
/// reopened by an approval is committed again with its results.
pub(crate) fn cite<'a>(
    events: impl DoubleEndedIterator<Item = &'a StoredEvent>,
    evidence: &[String],
    cited: &mut Vec<Cited>,
) {
    for stored in events.rev() {
        if cited.len() == evidence.len() {
            return;
        }
        let EventBody::Turn(turn) = &stored.event.body else {
            continue;
        };
        let calls = match &turn.decision {
            ProposedDecision::ToolCalls { calls }
            | ProposedDecision::RequestApproval { calls, .. } => calls,
            ProposedDecision::Final { .. }
            | ProposedDecision::Clarification { .. }
            | ProposedDecision::CannotContinue { .. }
            | ProposedDecision::Unparseable { .. } => continue,
        };
        for result in &turn.results {
            let id = result.call_id.as_str();
            if !evidence.iter().any(|cited| cited == id) || cited.iter().any(|c| c.call_id == id) {
                continue;
            }
            let call = calls.iter().find(|call| call.call_id == id);
            cited.push(Cited {
                call_id: id.to_owned(),
                turn: turn.turn,
                tool: call.map(|c| c.tool.clone()).unwrap_or_default(),
                arguments_json: call.map(|c| c.arguments_json.clone()).unwrap_or_default(),
                outcome: result.outcome.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use agentloop_engine::{Limits, ToolCatalog};

    use super::*;

    fn spec(script: Option<&str>) -> InvocationSpec {
        InvocationSpec {
            goal: "g".into(),
            profile: "default".into(),
            actor: String::new(),
            tenant: String::new(),
            roles: None,
            limits: Limits::default(),
            tools: Arc::new(ToolCatalog::default()),
            script: script.map(str::to_owned),
            trace: None,
        }
    }

    /// A script is parsed as the runner starts, once, and the invocations that run the
    /// same one share it; one that does not parse fails its decisions, saying why.
    #[test]
    fn a_script_is_parsed_once_and_shared_and_a_bad_one_says_why() {
        let scripts = Interner::new(8);
        let text = r#"{"turns": [{"final": "done"}]}"#;
        let first = ModelContext::new(&mut spec(Some(text)), Vec::new(), &scripts);
        let second = ModelContext::new(&mut spec(Some(text)), Vec::new(), &scripts);
        let (Ok(Some(a)), Ok(Some(b))) = (first.script(), second.script()) else {
            panic!("both parse");
        };
        assert!(std::ptr::eq(a, b), "one parsed script for both");
        assert_eq!(a.text(), text);
        assert_eq!(a.model().turns().len(), 1);

        let none = ModelContext::new(&mut spec(None), Vec::new(), &scripts);
        assert!(matches!(none.script(), Ok(None)));
        let bad = ModelContext::new(&mut spec(Some(r#"{"turns": []}"#)), Vec::new(), &scripts);
        assert!(bad.script().is_err_and(|why| !why.is_empty()));
    }
}
