//! What the orchestrator records of its invocations: the metrics it serves on
//! `/metrics`, and the spans of a run (`invoke_agent` per segment of an invocation, and
//! under it `authorize`, `execute_tool {tool}`, `verify`, `reconcile {tool}`, `commit`).
//!
//! Every label comes from a closed set (terminal reasons, how a lease was taken, what a
//! wait is for): no invocation ID, tenant or tool argument ever becomes a label.

use agentloop_engine::{CallOutcome, TerminalReason, ToolCall, UnixMillis};
use agentloop_telemetry::metrics::{HistogramFamily, long_seconds, seconds, sizes};
use agentloop_telemetry::prometheus_client::encoding::EncodeLabelSet;
use agentloop_telemetry::prometheus_client::metrics::counter::Counter;
use agentloop_telemetry::prometheus_client::metrics::family::Family;
use agentloop_telemetry::prometheus_client::metrics::gauge::Gauge;
use agentloop_telemetry::prometheus_client::metrics::histogram::Histogram;
use agentloop_telemetry::semconv::{
    EFFECT_KEY, GEN_AI_AGENT_NAME, GEN_AI_CONVERSATION_ID, GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_CALL_ARGUMENTS, GEN_AI_TOOL_CALL_ID, GEN_AI_TOOL_CALL_RESULT, GEN_AI_TOOL_NAME,
    GEN_AI_TOOL_TYPE, INVOCATION_ID, OP_EXECUTE_TOOL, OP_INVOKE_AGENT, RESUMED_BY, TENANT,
    TOOL_OUTCOME, TURN,
};
use agentloop_telemetry::{ActiveSpan, KeyValue, SpanKind, SpanStart, Telemetry};

/// Labels naming a terminal reason.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct Reason {
    reason: &'static str,
}

/// How this worker came to hold an invocation another one held before.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct How {
    how: &'static str,
}

/// What waiting invocations wait for.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct For {
    r#for: &'static str,
}

/// Why a runner starts on an invocation that ran before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resumed {
    /// A human replied to its wait.
    Reply,
    /// A sweep found it running with nobody holding it (a restart, a worker gone).
    Sweep,
    /// Another worker handed it off as it drained.
    Handoff,
}

impl Resumed {
    fn as_str(self) -> &'static str {
        match self {
            Resumed::Reply => "reply",
            Resumed::Sweep => "sweep",
            Resumed::Handoff => "handoff",
        }
    }
}

/// The orchestrator's telemetry and its metrics, registered once.
#[derive(Debug, Clone)]
pub(crate) struct Instruments {
    pub(crate) telemetry: Telemetry,
    started: Counter,
    ended: Family<Reason, Counter>,
    invocation_seconds: HistogramFamily<Reason>,
    pub(crate) turn_seconds: Histogram,
    pub(crate) commit_seconds: Histogram,
    pub(crate) commit_events: Histogram,
    pub(crate) leases_held: Gauge,
    pub(crate) leases_lost: Counter,
    taken_over: Family<How, Counter>,
    pub(crate) running: Gauge,
    waiting: Family<For, Gauge>,
}

impl Instruments {
    pub(crate) fn new(telemetry: Telemetry) -> Instruments {
        let m = telemetry.metrics();
        Instruments {
            started: m.counter(
                "invocations_started",
                "Invocations StartInvocation created.",
            ),
            ended: m.counters(
                "invocations_ended",
                "Runs that ended, by terminal reason (a wait for a human ends a run; its resumption ends again).",
            ),
            invocation_seconds: m.histograms(
                "invocation_duration_seconds",
                "From an invocation's creation to the end of a run, by terminal reason.",
                long_seconds,
            ),
            turn_seconds: m.histogram(
                "turn_duration_seconds",
                "From asking the model to committing the turn.",
                seconds,
            ),
            commit_seconds: m.histogram(
                "commit_duration_seconds",
                "One commit to the event store, until it is durable.",
                seconds,
            ),
            commit_events: m.histogram(
                "commit_events",
                "Events one commit carries (the group the engine commits at once).",
                sizes,
            ),
            leases_held: m.gauge("leases_held", "Invocation leases this worker holds."),
            leases_lost: m.counter(
                "leases_lost",
                "Leases lost while running (renewals failed, another worker took over): the runner stopped without committing more.",
            ),
            taken_over: m.counters(
                "leases_taken_over",
                "Invocations this worker took over from another (how: sweep, handoff).",
            ),
            running: m.gauge("invocations_running", "Invocations this worker runs."),
            waiting: m.gauges(
                "invocations_waiting",
                "Invocations parked until a human answers, by what they wait for (approval, \
                 clarification), counted in the event store (the same on every worker).",
            ),
            telemetry,
        }
    }

    pub(crate) fn started(&self) {
        self.started.inc();
    }

    /// A run ended with `reason`; the invocation was created at `created_at`.
    pub(crate) fn ended(&self, reason: TerminalReason, created_at: UnixMillis, now: UnixMillis) {
        let reason = Reason {
            reason: reason.as_str(),
        };
        self.ended.get_or_create(&reason).inc();
        let seconds = now.0.saturating_sub(created_at.0) as f64 / 1000.0;
        self.invocation_seconds
            .get_or_create(&reason)
            .observe(seconds);
    }

    /// The store holds `counts` waiting invocations by the reason their run stopped.
    pub(crate) fn waiting(&self, counts: &[(TerminalReason, u64)]) {
        for (reason, wait) in [
            (TerminalReason::ApprovalRequired, "approval"),
            (TerminalReason::ClarificationRequired, "clarification"),
        ] {
            let count = counts
                .iter()
                .find(|(counted, _)| *counted == reason)
                .map_or(0, |(_, count)| *count);
            self.waiting
                .get_or_create(&For { r#for: wait })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    pub(crate) fn taken_over(&self, why: Resumed) {
        if why != Resumed::Reply {
            self.taken_over
                .get_or_create(&How { how: why.as_str() })
                .inc();
        }
    }

    /// The `invoke_agent` span of one segment of an invocation's run: the current
    /// context's child for a new invocation (the caller's, on StartInvocation), and for a
    /// resumed one the child of the earlier segment (`earlier`, its stored
    /// `traceparent`), linked to it, so that the invocation stays one trace.
    pub(crate) fn invoke_agent(
        &self,
        id: uuid::Uuid,
        profile: &str,
        tenant: &str,
        earlier: Option<&str>,
        resumed: Option<Resumed>,
    ) -> ActiveSpan {
        let start = || {
            let mut attributes = vec![
                KeyValue::new(GEN_AI_OPERATION_NAME, OP_INVOKE_AGENT),
                KeyValue::new(GEN_AI_AGENT_NAME, profile.to_owned()),
                KeyValue::new(GEN_AI_CONVERSATION_ID, id.to_string()),
                KeyValue::new(INVOCATION_ID, id.to_string()),
                KeyValue::new(TENANT, tenant.to_owned()),
            ];
            if let Some(resumed) = resumed {
                attributes.push(KeyValue::new(RESUMED_BY, resumed.as_str()));
            }
            SpanStart::new(format!("{OP_INVOKE_AGENT} {profile}"), attributes)
        };
        match earlier.and_then(agentloop_telemetry::parse_traceparent) {
            Some(earlier) => self
                .telemetry
                .span_after(SpanKind::Internal, earlier, start),
            None => self.telemetry.span(SpanKind::Internal, start),
        }
    }
}

impl Instruments {
    /// The `execute_tool {tool}` span of one call, under the current context (the
    /// invocation's): the effect key of a write (`answered`: the seq of the answer it is
    /// sent with), the arguments only when content is recorded.
    pub(crate) fn execute_tool(
        &self,
        invocation: uuid::Uuid,
        turn: u32,
        call: &ToolCall,
        writes: bool,
        answered: Option<u64>,
    ) -> ActiveSpan {
        self.telemetry.span(SpanKind::Internal, || {
            let mut attributes = vec![
                KeyValue::new(GEN_AI_OPERATION_NAME, OP_EXECUTE_TOOL),
                KeyValue::new(GEN_AI_TOOL_NAME, call.tool.to_string()),
                KeyValue::new(GEN_AI_TOOL_CALL_ID, call.call_id.as_str().to_owned()),
                KeyValue::new(GEN_AI_TOOL_TYPE, "function"),
                KeyValue::new(TURN, i64::from(turn)),
            ];
            if writes {
                attributes.push(KeyValue::new(
                    EFFECT_KEY,
                    crate::effects::effect_key(invocation, turn, call, answered),
                ));
            }
            if let Some(arguments) = self.content_json(&call.arguments_json) {
                attributes.push(KeyValue::new(GEN_AI_TOOL_CALL_ARGUMENTS, arguments));
            }
            SpanStart::new(format!("{OP_EXECUTE_TOOL} {}", call.tool), attributes)
        })
    }

    /// Ends a call's span with what the call came to.
    pub(crate) fn tool_done(&self, span: &ActiveSpan, outcome: &CallOutcome) {
        span.set(|| {
            let mut attributes = vec![KeyValue::new(TOOL_OUTCOME, outcome.kind())];
            if let CallOutcome::Output { output_json } = outcome
                && let Some(result) = self.content_json(output_json)
            {
                attributes.push(KeyValue::new(GEN_AI_TOOL_CALL_RESULT, result));
            }
            attributes
        });
        match outcome {
            CallOutcome::Error(error) => span.fail("tool_error", || error.message.clone()),
            CallOutcome::Unknown { detail } => span.fail("outcome_unknown", || detail.clone()),
            CallOutcome::Output { .. }
            | CallOutcome::Cancelled
            | CallOutcome::NotStarted
            | CallOutcome::InputRequired(_) => {}
        }
        span.end();
    }

    /// A span of the runner's own work (`authorize`, `verify`, `commit`, `reconcile
    /// {tool}`) at `turn`, under the current context.
    pub(crate) fn step(&self, name: impl FnOnce() -> String, turn: u32) -> ActiveSpan {
        self.telemetry.span(SpanKind::Internal, || {
            SpanStart::new(name(), vec![KeyValue::new(TURN, i64::from(turn))])
        })
    }

    /// `json` (a tool's arguments or output) as a span may carry it: redacted and cut,
    /// and only when content is recorded.
    fn content_json(&self, json: &str) -> Option<String> {
        let content = self.telemetry.content();
        if !content.records() {
            return None;
        }
        match serde_json::from_str::<serde_json::Value>(json) {
            Ok(value) => content.json(&value),
            Err(_) => content.text(json),
        }
    }
}
