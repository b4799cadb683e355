//! What the gateway records of the calls it forwards: their duration and outcome by
//! tool. Only a registered tool's name becomes a label, and at most [`MAX_LABEL_SETS`]
//! label sets are ever made in one process, so executors that register and deregister
//! tools under new names cannot grow a scrape without bound: past it, new names count as
//! `other`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentloop_proto::v1::tool_result::Outcome;
use agentloop_telemetry::Telemetry;
use agentloop_telemetry::metrics::{HistogramFamily, seconds};
use agentloop_telemetry::prometheus_client::encoding::EncodeLabelSet;

use crate::config::MAX_TOOLS;

/// Label sets that may be made: every outcome of one full registry's tools.
pub(crate) const MAX_LABEL_SETS: usize = MAX_TOOLS * 5;

/// A call's labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Call {
    tool: String,
    outcome: &'static str,
}

/// The gateway's call metrics.
#[derive(Debug)]
pub(crate) struct Observed {
    seconds: HistogramFamily<Call>,
    /// Label sets made so far.
    made: AtomicUsize,
}

impl Observed {
    pub(crate) fn new(telemetry: &Telemetry) -> Observed {
        Observed {
            seconds: telemetry.metrics().histograms(
                "tool_call_duration_seconds",
                "Calls the gateway forwarded (or answered at once), by registered tool and \
                 outcome (output, error, cancelled, not_started, unknown, input_required).",
                seconds,
            ),
            made: AtomicUsize::new(0),
        }
    }

    /// `tool`'s call came to `outcome` after `took`.
    pub(crate) fn call_done(&self, tool: &str, outcome: &Outcome, took: Duration) {
        let outcome = match outcome {
            Outcome::Output(_) => "output",
            Outcome::Error(_) => "error",
            Outcome::Cancelled(_) => "cancelled",
            Outcome::NotStarted(_) => "not_started",
            Outcome::Unknown(_) => "unknown",
            Outcome::InputRequired(_) => "input_required",
        };
        let mut labels = Call {
            tool: tool.to_owned(),
            outcome,
        };
        if self.seconds.get(&labels).is_none() && !self.admit() {
            "other".clone_into(&mut labels.tool);
        }
        self.seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// Whether one more label set may be made (two racing for the same one both count,
    /// so the bound errs low).
    fn admit(&self) -> bool {
        self.made
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < MAX_LABEL_SETS).then_some(n + 1)
            })
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentloop_proto::v1::ToolOutput;

    #[test]
    fn past_the_bound_new_names_count_as_other() {
        let telemetry = Telemetry::off();
        let observed = Observed::new(&telemetry);
        let output = Outcome::Output(ToolOutput::default());
        for n in 0..MAX_LABEL_SETS {
            observed.call_done(&format!("tool{n}"), &output, Duration::ZERO);
        }
        // A name seen before keeps its label; a new one is `other`.
        observed.call_done("tool0", &output, Duration::ZERO);
        observed.call_done("one-too-many", &output, Duration::ZERO);
        let text = telemetry.metrics().encode();
        let count = |tool: &str| {
            agentloop_telemetry::metrics::sample(
                &text,
                &format!(
                    "agentloop_tool_call_duration_seconds_count{{tool=\"{tool}\",outcome=\"output\"}}"
                ),
            )
        };
        assert_eq!(count("tool0"), Some(2.0));
        assert_eq!(count("other"), Some(1.0));
        assert_eq!(count("one-too-many"), None);
    }
}
