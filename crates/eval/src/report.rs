//! The verdicts of a suite, and the aggregate over them: as text, as JSON, and as JUnit
//! XML for CI.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use agentloop_engine::{TerminalReason, nearest_rank};
use serde::Serialize;

use crate::case::{ExpectedCall, Loaded};
use crate::run::{Call, Run, matches};

/// The verdict of one run of a case.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// The case's name.
    pub case: String,
    /// The case file.
    pub file: String,
    /// Which run of the case (1 unless it repeats).
    pub run: u32,
    /// The case's tags.
    pub tags: Vec<String>,
    /// Every difference from the expectations; none is a pass.
    pub differences: Vec<String>,
    /// What the run showed; none when it could not be run (the difference says why).
    pub observed: Option<Run>,
    /// Whether the case expects a terminal reason, and the run ended with one of them.
    #[serde(skip)]
    pub reason_expected: Option<bool>,
    /// Expected calls whose tool was called, and whose tool and arguments matched, of
    /// the expected calls of its trajectory.
    #[serde(skip)]
    pub calls: Option<CallScore>,
}

/// How many expected calls a run made by tool, and by tool and arguments.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CallScore {
    /// Expected calls.
    pub expected: usize,
    /// Of them, made with the same tool.
    pub tool: usize,
    /// Of them, made with the same tool and arguments.
    pub arguments: usize,
}

impl Verdict {
    /// Judges `run` (or the error that kept it from running) against `case`.
    pub fn of(case: &Loaded, run: u32, observed: Result<Run, String>) -> Verdict {
        let (differences, reason_expected, calls, observed) = match observed {
            Ok(observed) => {
                let differences = crate::run::judge(case, &observed);
                let reason_expected = case
                    .case
                    .expect
                    .reason
                    .as_ref()
                    .map(|reasons| reasons.all().contains(&observed.reason));
                let calls = case
                    .case
                    .expect
                    .trajectory
                    .as_ref()
                    .map(|trajectory| score(&trajectory.calls, &observed));
                (differences, reason_expected, calls, Some(observed))
            }
            Err(error) => (vec![format!("not run: {error}")], None, None, None),
        };
        Verdict {
            case: case.case.name.clone(),
            file: case.path.display().to_string(),
            run,
            tags: case.case.tags.clone(),
            differences,
            observed,
            reason_expected,
            calls,
        }
    }

    /// No difference.
    pub fn passed(&self) -> bool {
        self.differences.is_empty()
    }
}

/// Counts expected calls made by tool, then by tool and arguments: each call made
/// counts for one expected call at most, in the order of the expectation.
fn score(expected: &[ExpectedCall], run: &Run) -> CallScore {
    let pick = |same: &dyn Fn(&ExpectedCall, &Call) -> bool| {
        let mut used = vec![false; run.calls.len()];
        expected
            .iter()
            .filter(|wanted| {
                let found = run
                    .calls
                    .iter()
                    .enumerate()
                    .find(|(index, call)| !used[*index] && same(wanted, call));
                found.map(|(index, _)| used[index] = true).is_some()
            })
            .count()
    };
    CallScore {
        expected: expected.len(),
        tool: pick(&|wanted, call| wanted.name == call.name),
        arguments: pick(&|wanted, call| matches(wanted, call)),
    }
}

/// What a suite's runs show together.
#[derive(Debug, Clone, Serialize)]
pub struct Aggregate {
    /// Runs.
    pub runs: usize,
    /// Runs without a difference.
    pub passed: usize,
    /// `passed / runs` (1 for no runs).
    pub pass_rate: f64,
    /// Runs and passes by tag (runs of an untagged case under `untagged`).
    pub by_tag: BTreeMap<String, Rate>,
    /// Expected calls made with the right tool, of all expected calls.
    pub tool_accuracy: Option<f64>,
    /// Expected calls made with the right tool and arguments, of all expected calls.
    pub argument_accuracy: Option<f64>,
    /// Runs that ended as their case expected, of those whose case names a reason.
    pub reason_accuracy: Option<f64>,
    /// Runs that the repeated-plan check stopped (`no_progress`), of all runs.
    pub no_progress_rate: f64,
    /// Runs that used up their turns (`max_steps`), of all runs.
    pub max_steps_rate: f64,
    /// The cost of the runs that passed.
    pub passing: Totals,
    /// Writes applied more than once, in all runs.
    pub duplicate_effects: usize,
    /// Writes applied for calls the log does not show as run, in all runs.
    pub unauthorized_effects: usize,
    /// Durations by terminal reason, nearest-rank percentiles.
    pub duration_ms: BTreeMap<String, Percentiles>,
}

/// Runs, and how many passed.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Rate {
    /// Runs.
    pub runs: usize,
    /// Of them, passed.
    pub passed: usize,
}

/// What the passing runs spent, in sum and per run.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Totals {
    /// Turns.
    pub turns: u64,
    /// Tool calls.
    pub calls: u64,
    /// Tokens.
    pub tokens: u64,
    /// Micro-dollars.
    pub cost_micro_usd: u64,
}

/// Durations of the runs that ended with one reason.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    /// Runs.
    pub runs: usize,
    /// Milliseconds.
    pub p50: u64,
    /// Milliseconds.
    pub p95: u64,
    /// Milliseconds.
    pub p99: u64,
}

fn ratio(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        1.0
    } else {
        #[expect(
            clippy::cast_precision_loss,
            reason = "counts of runs and calls are far below 2^52"
        )]
        let ratio = part as f64 / whole as f64;
        ratio
    }
}

impl Aggregate {
    /// The aggregate over `verdicts`.
    pub fn of(verdicts: &[Verdict]) -> Aggregate {
        let passed = verdicts.iter().filter(|v| v.passed()).count();
        let mut by_tag: BTreeMap<String, Rate> = BTreeMap::new();
        for verdict in verdicts {
            let untagged = ["untagged".to_owned()];
            let tags = if verdict.tags.is_empty() {
                &untagged[..]
            } else {
                &verdict.tags[..]
            };
            for tag in tags {
                let rate = by_tag.entry(tag.clone()).or_default();
                rate.runs += 1;
                rate.passed += usize::from(verdict.passed());
            }
        }
        let scores: Vec<CallScore> = verdicts.iter().filter_map(|v| v.calls).collect();
        let expected: usize = scores.iter().map(|s| s.expected).sum();
        let accuracy = |part: usize| (!scores.is_empty()).then(|| ratio(part, expected));
        let reasons: Vec<bool> = verdicts.iter().filter_map(|v| v.reason_expected).collect();
        let observed: Vec<&Run> = verdicts
            .iter()
            .filter_map(|v| v.observed.as_ref())
            .collect();
        let ended = |reason| observed.iter().filter(|run| run.reason == reason).count();
        let mut passing = Totals::default();
        for run in verdicts
            .iter()
            .filter(|v| v.passed())
            .filter_map(|v| v.observed.as_ref())
        {
            passing.turns += u64::from(run.turns);
            passing.calls += u64::try_from(run.calls.len()).unwrap_or(u64::MAX);
            passing.tokens = passing.tokens.saturating_add(run.tokens);
            passing.cost_micro_usd = passing.cost_micro_usd.saturating_add(run.cost_micro_usd);
        }
        let mut durations: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for run in &observed {
            durations
                .entry(run.reason.to_string())
                .or_default()
                .push(run.duration_ms);
        }
        let duration_ms = durations
            .into_iter()
            .map(|(reason, mut values)| {
                values.sort_unstable();
                let percentiles = Percentiles {
                    runs: values.len(),
                    p50: nearest_rank(&values, 50),
                    p95: nearest_rank(&values, 95),
                    p99: nearest_rank(&values, 99),
                };
                (reason, percentiles)
            })
            .collect();
        Aggregate {
            runs: verdicts.len(),
            passed,
            pass_rate: ratio(passed, verdicts.len()),
            by_tag,
            tool_accuracy: accuracy(scores.iter().map(|s| s.tool).sum()),
            argument_accuracy: accuracy(scores.iter().map(|s| s.arguments).sum()),
            reason_accuracy: (!reasons.is_empty())
                .then(|| ratio(reasons.iter().filter(|&&r| r).count(), reasons.len())),
            no_progress_rate: ratio(ended(TerminalReason::NoProgress), verdicts.len()),
            max_steps_rate: ratio(ended(TerminalReason::MaxSteps), verdicts.len()),
            passing,
            duplicate_effects: observed.iter().map(|run| run.duplicate_effects()).sum(),
            unauthorized_effects: observed.iter().map(|run| run.unauthorized_effects()).sum(),
            duration_ms,
        }
    }

    /// The aggregate as lines of text.
    pub fn text(&self) -> String {
        let percent = |rate: f64| format!("{:.1}%", rate * 100.0);
        let optional = |rate: Option<f64>| rate.map_or_else(|| "n/a".to_owned(), percent);
        let mut text = String::new();
        let _ = writeln!(
            text,
            "passed {} of {} runs ({})",
            self.passed,
            self.runs,
            percent(self.pass_rate)
        );
        for (tag, rate) in &self.by_tag {
            let _ = writeln!(
                text,
                "  {tag}: {} of {} ({})",
                rate.passed,
                rate.runs,
                percent(ratio(rate.passed, rate.runs))
            );
        }
        let _ = writeln!(
            text,
            "tool accuracy {}, argument accuracy {}, stop-reason accuracy {}",
            optional(self.tool_accuracy),
            optional(self.argument_accuracy),
            optional(self.reason_accuracy)
        );
        let _ = writeln!(
            text,
            "repeated plan (no_progress) {}, out of turns (max_steps) {}",
            percent(self.no_progress_rate),
            percent(self.max_steps_rate)
        );
        let per = |total: u64| {
            if self.passed == 0 {
                "0".to_owned()
            } else {
                #[expect(clippy::cast_precision_loss, reason = "display only")]
                let mean = total as f64 / self.passed as f64;
                format!("{mean:.1}")
            }
        };
        let _ = writeln!(
            text,
            "passing runs, per run: {} turns, {} calls, {} tokens, {} cost",
            per(self.passing.turns),
            per(self.passing.calls),
            per(self.passing.tokens),
            agentloop_engine::MicroUsd(
                self.passing
                    .cost_micro_usd
                    .checked_div(u64::try_from(self.passed).unwrap_or(u64::MAX))
                    .unwrap_or(0)
            )
        );
        let _ = writeln!(
            text,
            "side effects: {} duplicate, {} unauthorized",
            self.duplicate_effects, self.unauthorized_effects
        );
        for (reason, p) in &self.duration_ms {
            let _ = writeln!(
                text,
                "duration {reason} ({} runs): p50 {} ms, p95 {} ms, p99 {} ms",
                p.runs, p.p50, p.p95, p.p99
            );
        }
        text
    }
}

/// One line per run: `pass NAME`, or `FAIL NAME: the first difference`.
pub fn line(verdict: &Verdict) -> String {
    let name = if verdict.run > 1 {
        format!("{} (run {})", verdict.case, verdict.run)
    } else {
        verdict.case.clone()
    };
    match verdict.differences.first() {
        None => format!("pass {name}"),
        Some(first) => format!("FAIL {name}: {first}"),
    }
}

/// The verdicts as a JUnit XML report: one test suite, a test case per run, a failure
/// naming the first difference (every difference in its body).
pub fn junit(verdicts: &[Verdict], elapsed_ms: u64) -> String {
    let failures = verdicts.iter().filter(|v| !v.passed()).count();
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        xml,
        "<testsuites name=\"agentloop eval\" tests=\"{}\" failures=\"{failures}\" time=\"{}\">",
        verdicts.len(),
        seconds(elapsed_ms)
    );
    let _ = writeln!(
        xml,
        "  <testsuite name=\"agentloop eval\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"0\" time=\"{}\">",
        verdicts.len(),
        seconds(elapsed_ms)
    );
    for verdict in verdicts {
        let name = if verdict.run > 1 {
            format!("{} (run {})", verdict.case, verdict.run)
        } else {
            verdict.case.clone()
        };
        let time = verdict.observed.as_ref().map_or(0, |run| run.duration_ms);
        let _ = write!(
            xml,
            "    <testcase name=\"{}\" classname=\"{}\" file=\"{}\" time=\"{}\"",
            escape(&name),
            escape(&verdict.file),
            escape(&verdict.file),
            seconds(time)
        );
        match verdict.differences.first() {
            None => xml.push_str("/>\n"),
            Some(first) => {
                let _ = writeln!(
                    xml,
                    ">\n      <failure message=\"{}\" type=\"difference\">{}</failure>\n    </testcase>",
                    escape(first),
                    escape(&verdict.differences.join("\n"))
                );
            }
        }
    }
    xml.push_str("  </testsuite>\n</testsuites>\n");
    xml
}

fn seconds(millis: u64) -> String {
    format!("{}.{:03}", millis / 1000, millis % 1000)
}

/// Text as XML character data or an attribute value: markup escaped, and characters XML
/// 1.0 cannot carry (most control characters) replaced.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            '\n' => escaped.push_str("&#10;"),
            '\t' | '\r' => escaped.push(' '),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {
                escaped.push('\u{FFFD}');
            }
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_markup_and_what_xml_cannot_carry() {
        assert_eq!(
            escape("a<b>&\"c'\u{1}\n"),
            "a&lt;b&gt;&amp;&quot;c&apos;\u{FFFD}&#10;"
        );
    }
}
