//! What `agentloop replay` prints: per invocation, the calls and answers today's rules
//! would decide differently; then the totals.

use std::io::Write as _;

use agentloop_runtime::replay::{Changed, Replayed};
use serde::Serialize;

/// The differences of every replayed invocation, summed.
#[derive(Debug, Default, Serialize)]
struct Totals {
    invocations: usize,
    changed: usize,
    batches: usize,
    calls: usize,
    answers: usize,
    now_refused: usize,
    now_need_approval: usize,
    now_allowed: usize,
    answers_now_rejected: usize,
}

impl Totals {
    fn of(replayed: &[Replayed]) -> Totals {
        let mut totals = Totals::default();
        for one in replayed {
            totals.invocations += 1;
            totals.changed += usize::from(one.changed());
            totals.batches += one.batches;
            totals.calls += one.calls;
            totals.answers += one.answers;
            totals.now_refused += one.now_refused.len();
            totals.now_need_approval += one.now_need_approval.len();
            totals.now_allowed += one.now_allowed.len();
            totals.answers_now_rejected += one.answers_now_rejected.len();
        }
        totals
    }
}

/// Prints `replayed` as text, or as one JSON document.
///
/// # Errors
///
/// When stdout cannot be written.
pub(crate) fn print(replayed: &[Replayed], json: bool) -> anyhow::Result<()> {
    let totals = Totals::of(replayed);
    let mut out = std::io::stdout().lock();
    if json {
        let document = serde_json::json!({"invocations": replayed, "totals": totals});
        writeln!(out, "{}", serde_json::to_string_pretty(&document)?)?;
        return Ok(());
    }
    for one in replayed {
        let reason = one
            .reason
            .map_or_else(|| "running".to_owned(), |reason| reason.to_string());
        writeln!(
            out,
            "{} ({reason}): {} batches, {} calls, {} answers judged again",
            one.invocation_id, one.batches, one.calls, one.answers
        )?;
        if !one.changed() {
            writeln!(out, "  unchanged")?;
        }
        for (label, changes) in [
            ("now refused", &one.now_refused),
            ("now needs approval", &one.now_need_approval),
            ("now allowed", &one.now_allowed),
        ] {
            for change in changes {
                writeln!(out, "  {label}: {}", render(change))?;
            }
        }
        for answer in &one.answers_now_rejected {
            writeln!(
                out,
                "  answer now rejected: turn {}: {}",
                answer.turn,
                answer.reasons.join("; ")
            )?;
        }
    }
    writeln!(
        out,
        "{} invocations, {} would change: {} calls now refused, {} now need approval, {} now allowed, {} answers now rejected",
        totals.invocations,
        totals.changed,
        totals.now_refused,
        totals.now_need_approval,
        totals.now_allowed,
        totals.answers_now_rejected
    )?;
    Ok(())
}

fn render(change: &Changed) -> String {
    let policies = if change.policies.is_empty() {
        String::new()
    } else {
        format!(" [{}]", change.policies.join(", "))
    };
    format!(
        "turn {} call {} {} {}: {}{policies}",
        change.turn, change.call_id, change.tool, change.arguments_json, change.why
    )
}
