//! Provider adapters: OpenAI Chat Completions and Anthropic Messages over HTTP. What
//! they share: configuration, the retrying transport, the neutral prompt and the
//! conversion of a provider's answer into a closed `Decision`.

pub(crate) mod anthropic;
pub(crate) mod config;
pub(crate) mod context;
pub(crate) mod http;
pub(crate) mod openai;

use crate::model::{Proposal, Question};
use agentloop_engine::{DecisionBounds, ProposedCall, ProposedDecision, Usage};

/// Most raw output quoted in an `InvalidOutput`.
const MAX_RAW_BYTES: usize = 4096;

/// Most tool calls taken from one response; more is invalid output.
pub const MAX_CALLS_PER_RESPONSE: usize = 64;

/// A tool call as a provider returned it, before validation.
pub(crate) struct RawCall<'a> {
    pub(crate) id: Option<&'a str>,
    pub(crate) name: Option<&'a str>,
    /// The arguments as JSON text.
    pub(crate) arguments: String,
}

pub(crate) fn invalid(reason: impl Into<String>, raw: &str) -> Proposal {
    Proposal::Invalid {
        reason: reason.into(),
        raw: context::truncate(raw, MAX_RAW_BYTES),
    }
}

pub(crate) fn cannot_continue(reason: &str) -> Proposal {
    Proposal::Decision(ProposedDecision::CannotContinue {
        reason: reason.to_owned(),
    })
}

/// The decision for a text reply, or `None` when it holds no answer besides its
/// `Evidence:` line, which each adapter reports as it reports an empty text.
pub(crate) fn final_answer(text: &str) -> Option<Proposal> {
    let (answer, evidence) = split_evidence(text);
    if answer.trim().is_empty() {
        return None;
    }
    Some(Proposal::Decision(ProposedDecision::Final {
        answer,
        evidence,
    }))
}

/// The label of the line that closes a final answer (`context` asks for it).
pub(crate) const EVIDENCE_LABEL: &str = "Evidence:";

/// What models put around an ID on the `Evidence:` line: code ticks, quotes, brackets,
/// bold, a closing full stop. None of it occurs at either end of a provider's call ID
/// or of a runtime one.
const ID_WRAPPING: [char; 17] = [
    '`', '"', '\'', '“', '”', '‘', '’', '[', ']', '(', ')', '{', '}', '<', '>', '*', '.',
];

/// Splits the closing `Evidence:` line off a final answer: the answer without it, and
/// the call IDs it names. Models write that line loosely, so the parser is lenient:
/// markdown emphasis around the label, any letter case, commas or blanks between the
/// IDs, IDs in backticks, quotes or brackets. What cannot name a committed call is
/// dropped instead of failing the answer: `none`, empty items, repeats, IDs longer
/// than any the engine accepts, and items past the engine's evidence bound. Without
/// such a line the text is the answer as it came, and it cites nothing.
pub(crate) fn split_evidence(text: &str) -> (String, Vec<String>) {
    let body = text.trim_end();
    let (rest, last) = match body.rfind('\n') {
        Some(at) => (&body[..at], &body[at + 1..]),
        None => ("", body),
    };
    let Some(list) = evidence_list(last) else {
        return (text.to_owned(), Vec::new());
    };
    let bounds = DecisionBounds::default();
    let mut evidence: Vec<String> = Vec::new();
    for item in list.split(|c: char| c == ',' || c.is_whitespace()) {
        let id = item.trim_matches(&ID_WRAPPING[..]);
        if id.is_empty()
            || id.eq_ignore_ascii_case("none")
            || id.len() > bounds.max_call_id_bytes
            || evidence.iter().any(|seen| seen == id)
        {
            continue;
        }
        if evidence.len() == bounds.max_evidence {
            break;
        }
        evidence.push(id.to_owned());
    }
    (rest.trim().to_owned(), evidence)
}

/// What follows the label when `line` is an `Evidence:` line (`**Evidence:**`,
/// `*evidence*:`, `EVIDENCE:` and the like), else `None`.
fn evidence_list(line: &str) -> Option<&str> {
    let emphasis = |c: char| c == '*' || c == '_';
    let line = line.trim().trim_start_matches(emphasis);
    let word = EVIDENCE_LABEL.trim_end_matches(':');
    let head = line.get(..word.len())?;
    if !head.eq_ignore_ascii_case(word) {
        return None;
    }
    let after = line[word.len()..].trim_start_matches(|c: char| emphasis(c) || c.is_whitespace());
    let after = after.strip_prefix(':')?;
    Some(after.trim_start_matches(emphasis))
}

/// Tool calls become a `ToolCalls` decision; malformed arguments or a missing name make
/// the whole output invalid (the engine turns that into a repair turn or
/// invalid_decision). Unknown tools and non-object arguments pass: policy judges them.
pub(crate) fn tool_calls(request: &Question<'_>, raw: &[RawCall<'_>]) -> Proposal {
    if raw.len() > MAX_CALLS_PER_RESPONSE {
        return invalid(
            format!(
                "{} tool calls in one response; at most {MAX_CALLS_PER_RESPONSE} are accepted",
                raw.len()
            ),
            "",
        );
    }
    for (index, call) in raw.iter().enumerate() {
        let Some(name) = call.name.filter(|n| !n.trim().is_empty()) else {
            return invalid(
                format!("tool call {index} has no tool name"),
                &call.arguments,
            );
        };
        if let Err(error) = serde_json::from_str::<serde::de::IgnoredAny>(&call.arguments) {
            return invalid(
                format!("tool call {index} ({name}): arguments are not valid JSON: {error}"),
                &call.arguments,
            );
        }
    }
    let used = context::history_call_ids(request);
    let ids: Vec<Option<&str>> = raw.iter().map(|c| c.id).collect();
    let ids = context::assign_ids(request.turn, &ids, &used);
    let calls = raw
        .iter()
        .zip(ids)
        .map(|(call, call_id)| ProposedCall {
            call_id,
            tool: call.name.unwrap_or_default().to_owned(),
            arguments_json: call.arguments.clone(),
        })
        .collect();
    Proposal::Decision(ProposedDecision::ToolCalls { calls })
}

/// A tool's input schema as JSON; a descriptor with none (or a broken one) gets the
/// schema of "any object", since providers require one.
pub(crate) fn schema(text: &str) -> serde_json::Value {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({"type": "object"}))
}

/// What the model reads about a tool: its description, and while the gateway reports
/// its executor unavailable, that its calls fail until it is back, so the model can plan
/// around it instead of spending a turn to find out.
pub(crate) fn description(tool: &agentloop_proto::v1::ToolDescriptor) -> std::borrow::Cow<'_, str> {
    if tool.unavailable {
        std::borrow::Cow::Owned(format!(
            "{} (Unavailable right now: its executor is not answering, so calls to it fail \
             until it is back.)",
            tool.description
        ))
    } else {
        std::borrow::Cow::Borrowed(&tool.description)
    }
}

/// The reply a provider's response `body` carries: `outcome`, the tokens it reports,
/// the model it names (else the one configured) and its response ID. Its cost is set by
/// the price table (`PricedModel`), which knows what the tokens cost.
pub(crate) fn reply(
    proposal: Proposal,
    (input_tokens, output_tokens): (u64, u64),
    body: &serde_json::Value,
    configured_model: &str,
) -> crate::ModelReply {
    let text = |field: &str| body.get(field).and_then(serde_json::Value::as_str);
    crate::ModelReply {
        proposal,
        usage: Usage {
            input_tokens,
            output_tokens,
            cost: None,
        },
        model: text("model").unwrap_or(configured_model).to_owned(),
        response_id: text("id").unwrap_or("").to_owned(),
    }
}

/// A u64 field of a JSON object, 0 when absent.
pub(crate) fn tokens(value: &serde_json::Value, field: &str) -> u64 {
    value
        .get(field)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> (String, Vec<String>) {
        split_evidence(text)
    }

    #[test]
    fn the_closing_line_is_split_off_and_its_ids_kept_in_order() {
        assert_eq!(
            split("C-42 is gold.\n\nEvidence: call_1, toolu_01"),
            (
                "C-42 is gold.".into(),
                vec!["call_1".into(), "toolu_01".into()]
            )
        );
        // Blanks as separators, trailing whitespace and blank lines after it.
        assert_eq!(
            split("Gold.\nEvidence: call_1 call_2,call_3  \n\n  \t\n"),
            (
                "Gold.".into(),
                vec!["call_1".into(), "call_2".into(), "call_3".into()]
            )
        );
    }

    #[test]
    fn markdown_case_and_quoting_are_tolerated() {
        for text in [
            "Gold.\n**Evidence:** call_1, call_2",
            "Gold.\n**Evidence**: call_1, call_2",
            "Gold.\n*evidence:* `call_1`, `call_2`",
            "Gold.\nEVIDENCE : [\"call_1\", \"call_2\"]",
            "Gold.\n__Evidence:__ (call_1), 'call_2'.",
            "Gold.\nEvidence: **call_1**, <call_2>",
        ] {
            assert_eq!(
                split(text),
                ("Gold.".into(), vec!["call_1".into(), "call_2".into()]),
                "{text:?}"
            );
        }
    }

    #[test]
    fn none_empty_items_and_repeats_are_dropped() {
        assert_eq!(split("Gold.\nEvidence: none"), ("Gold.".into(), Vec::new()));
        assert_eq!(
            split("Gold.\n**Evidence:** None"),
            ("Gold.".into(), Vec::new())
        );
        assert_eq!(split("Gold.\nEvidence:"), ("Gold.".into(), Vec::new()));
        assert_eq!(
            split("Gold.\nEvidence: a, , a, `b`, b, a, none"),
            ("Gold.".into(), vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn a_text_without_the_line_is_the_answer_as_it_came() {
        for text in [
            "  Gold, with trailing space.  \n",
            "Evidence: call_1\nis what the first line says, not the last.",
            "The evidence: call_1 shows gold.",
            "Gold.\nEvidenced: call_1",
            "Évidence: call_1",
        ] {
            assert_eq!(split(text), (text.to_owned(), Vec::new()), "{text:?}");
        }
    }

    #[test]
    fn only_the_line_leaves_no_answer_and_so_no_decision() {
        assert_eq!(
            split("Evidence: call_1"),
            (String::new(), vec!["call_1".to_owned()])
        );
        assert!(final_answer("\n **Evidence:** call_1 \n").is_none());
        assert!(final_answer("Evidence: none").is_none());
        assert!(final_answer("  \n").is_none());
        assert_eq!(
            final_answer("Gold.\nEvidence: call_1"),
            Some(Proposal::Decision(ProposedDecision::Final {
                answer: "Gold.".into(),
                evidence: vec!["call_1".into()],
            }))
        );
    }

    #[test]
    fn citations_beyond_the_engine_bounds_are_dropped() {
        let bounds = DecisionBounds::default();
        let ids: Vec<String> = (0..bounds.max_evidence + 5)
            .map(|i| format!("c{i}"))
            .collect();
        let long = "x".repeat(bounds.max_call_id_bytes + 1);
        let at_limit = "y".repeat(bounds.max_call_id_bytes);
        let (answer, evidence) = split(&format!(
            "Gold.\nEvidence: {long}, {at_limit}, {}",
            ids.join(", ")
        ));
        assert_eq!(answer, "Gold.");
        assert_eq!(evidence.len(), bounds.max_evidence);
        assert_eq!(evidence[0], at_limit, "the over-long ID is dropped");
        assert_eq!(evidence[1..], ids[..bounds.max_evidence - 1]);
    }
}
