#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]
//! The scripted-model format: every decision kind, every error, exact arguments.

use std::time::Duration;

use agentloop_decision::{
    MAX_DELAY_MS, MAX_SCRIPT_BYTES, MAX_TURNS, ModelError, ScriptError, ScriptedCall,
    ScriptedDecision, ScriptedModel, ScriptedUsage,
};

fn parse(text: &str) -> ScriptedModel {
    ScriptedModel::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn final_answer(answer: &str) -> ScriptedDecision {
    ScriptedDecision::Final {
        answer: answer.into(),
        evidence: Vec::new(),
    }
}

fn error(text: &str) -> ScriptError {
    match ScriptedModel::parse(text) {
        Ok(model) => panic!("{text} parsed: {model:?}"),
        Err(e) => e,
    }
}

#[test]
fn every_decision_kind_parses() {
    let model = parse(
        r#"{"turns": [
            {"tool_calls": [{"id": "c1", "name": "lookup", "arguments": {"key": "a"}}], "delay_ms": 5,
             "usage": {"input_tokens": 10, "output_tokens": 3}},
            {"final": "42", "usage": {"cost_micro_usd": 250}},
            {"request_approval": {"summary": "pay", "calls": [{"id": "p", "name": "pay", "arguments": {"amount": 5}}]}},
            {"clarification": "which one?"},
            {"cannot_continue": "no access"},
            {"model_error": "quota"},
            {"raw": "not { json"}
        ], "repeat_last": false}"#,
    );
    let turns = model.turns();
    assert_eq!(turns.len(), 7);
    assert_eq!(
        turns[0].decision,
        ScriptedDecision::ToolCalls(vec![ScriptedCall {
            id: "c1".into(),
            name: "lookup".into(),
            arguments_json: r#"{"key": "a"}"#.into(),
        }])
    );
    assert_eq!(turns[0].delay, Duration::from_millis(5));
    assert_eq!(
        turns[0].usage,
        ScriptedUsage {
            input_tokens: 10,
            output_tokens: 3,
            cost_micro_usd: None,
        }
    );
    assert_eq!(turns[1].decision, final_answer("42"));
    assert_eq!(turns[1].delay, Duration::ZERO);
    assert_eq!(
        turns[1].usage,
        ScriptedUsage {
            cost_micro_usd: Some(250),
            ..ScriptedUsage::default()
        }
    );
    match &turns[2].decision {
        ScriptedDecision::RequestApproval { summary, calls } => {
            assert_eq!(summary, "pay");
            assert_eq!(calls[0].name, "pay");
            assert_eq!(calls[0].arguments_json, r#"{"amount": 5}"#);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        turns[3].decision,
        ScriptedDecision::Clarification("which one?".into())
    );
    assert_eq!(
        turns[4].decision,
        ScriptedDecision::CannotContinue("no access".into())
    );
    assert_eq!(
        turns[5].decision,
        ScriptedDecision::ModelError("quota".into())
    );
    assert_eq!(
        turns[6].decision,
        ScriptedDecision::Raw("not { json".into())
    );
    assert!(!model.repeat_last());
}

#[test]
fn arguments_are_kept_as_exact_text() {
    let model = parse(
        r#"{"turns": [{"tool_calls": [
            {"id": "a", "name": "t", "arguments": {"id": 123456789012345678901234567890, "small": 9007199254740993, "f": 1.10}},
            {"id": "b", "name": "t", "arguments": "not an object"},
            {"id": "c", "name": "t", "arguments": [1, 2]},
            {"id": "", "name": "", "arguments": null}
        ]}]}"#,
    );
    let ScriptedDecision::ToolCalls(calls) = &model.turns()[0].decision else {
        panic!("not tool calls")
    };
    assert_eq!(
        calls[0].arguments_json,
        r#"{"id": 123456789012345678901234567890, "small": 9007199254740993, "f": 1.10}"#
    );
    // Not "fixed": a string, an array and null stay what the model said.
    assert_eq!(calls[1].arguments_json, r#""not an object""#);
    assert_eq!(calls[2].arguments_json, "[1, 2]");
    assert_eq!(calls[3].arguments_json, "null");
    assert_eq!(calls[3].id, "");
}

#[test]
fn turn_mapping_and_repeat_last() {
    let once = parse(r#"{"turns": [{"final": "a"}, {"final": "b"}]}"#);
    assert!(once.turn(0).is_none());
    assert_eq!(once.turn(1).unwrap().decision, final_answer("a"));
    assert_eq!(once.turn(2).unwrap().decision, final_answer("b"));
    assert!(once.turn(3).is_none());
    let repeating = parse(r#"{"turns": [{"final": "a"}, {"final": "b"}], "repeat_last": true}"#);
    assert!(repeating.repeat_last());
    assert!(repeating.turn(0).is_none());
    assert_eq!(repeating.turn(3).unwrap().decision, final_answer("b"));
    assert_eq!(
        repeating.turn(u32::MAX).unwrap().decision,
        final_answer("b")
    );
}

#[test]
fn malformed_scripts_name_the_place() {
    let cases = [
        ("{", "$: "),
        (r#"{"turns": [], "extra": 1}"#, "unknown field `extra`"),
        (
            r#"{"turns": [{"final": "a"}, {"fnal": "b"}]}"#,
            "$.turns[1]: unknown field `fnal`",
        ),
        (
            r#"{"turns": [{"final": 3}]}"#,
            "$.turns[0]: invalid type: integer `3`, expected a string",
        ),
        (
            r#"{"turns": [{"final": "a", "delay_ms": -1}]}"#,
            "$.turns[0]: invalid value",
        ),
        (
            r#"{"turns": [{"final": "a", "usage": {"tokens": 1}}]}"#,
            "$.turns[0]: unknown field `tokens`",
        ),
        (
            r#"{"turns": [{"tool_calls": [{"id": "a", "name": "t", "arguments": {}}, {"id": "b", "arguments": {}}]}]}"#,
            "$.turns[0].tool_calls[1]: missing field `name`",
        ),
        (
            r#"{"turns": [{"tool_calls": [{"id": "a", "name": "t"}]}]}"#,
            "$.turns[0].tool_calls[0]: missing field `arguments`",
        ),
        (
            r#"{"turns": [{"request_approval": {"summary": "s", "calls": [{"id": 1, "name": "t", "arguments": {}}]}}]}"#,
            "$.turns[0].request_approval.calls[0]: invalid type",
        ),
        (
            r#"{"turns": [{"request_approval": {"calls": []}}]}"#,
            "$.turns[0]: missing field `summary`",
        ),
        (
            r#"{"turns": {"final": "a"}}"#,
            "$: invalid type: map, expected a sequence",
        ),
        (r#"{"repeat_last": true}"#, "$: missing field `turns`"),
        (
            r#"{"turns": [{"final": "a"}], "repeat_last": "yes"}"#,
            "$: invalid type",
        ),
    ];
    for (text, expected) in cases {
        let message = error(text).to_string();
        assert!(
            message.contains(expected),
            "{text}: {message:?} lacks {expected:?}"
        );
        assert!(
            matches!(error(text), ScriptError::Malformed { .. }),
            "{text}"
        );
    }
}

#[test]
fn structural_errors() {
    assert_eq!(error(r#"{"turns": []}"#), ScriptError::NoTurns);
    assert_eq!(
        error(r#"{"turns": [{"final": "a"}, {"delay_ms": 3}]}"#),
        ScriptError::NoKind { index: 1 }
    );
    assert_eq!(
        error(r#"{"turns": [{"final": "a", "raw": "b"}]}"#),
        ScriptError::SeveralKinds {
            index: 0,
            kinds: "final, raw".into()
        }
    );
    assert_eq!(
        error(r#"{"turns": [{"clarification": "a", "model_error": "b", "tool_calls": []}]}"#)
            .to_string(),
        "$.turns[0]: more than one decision kind (tool_calls, clarification, model_error); expected exactly one"
    );
    let too_slow = format!(
        r#"{{"turns": [{{"final": "a"}}, {{"final": "a", "delay_ms": {}}}]}}"#,
        MAX_DELAY_MS + 1
    );
    assert_eq!(
        error(&too_slow),
        ScriptError::DelayTooLong {
            index: 1,
            delay_ms: MAX_DELAY_MS + 1,
            limit: MAX_DELAY_MS
        }
    );
    let at_limit = format!(r#"{{"turns": [{{"final": "a", "delay_ms": {MAX_DELAY_MS}}}]}}"#);
    assert_eq!(
        parse(&at_limit).turns()[0].delay,
        Duration::from_millis(MAX_DELAY_MS)
    );
}

#[test]
fn size_bounds() {
    let turn = r#"{"final":"a"},"#;
    let many = format!(r#"{{"turns":[{}{{"final":"a"}}]}}"#, turn.repeat(MAX_TURNS));
    assert_eq!(
        error(&many),
        ScriptError::TooManyTurns {
            turns: MAX_TURNS + 1,
            limit: MAX_TURNS
        }
    );
    let max = format!(
        r#"{{"turns":[{}{{"final":"a"}}]}}"#,
        turn.repeat(MAX_TURNS - 1)
    );
    assert_eq!(parse(&max).turns().len(), MAX_TURNS);
    let huge = format!(
        r#"{{"turns":[{{"final":"{}"}}]}}"#,
        "x".repeat(MAX_SCRIPT_BYTES)
    );
    assert!(matches!(
        error(&huge),
        ScriptError::TooLarge {
            limit: MAX_SCRIPT_BYTES,
            ..
        }
    ));
}

#[test]
fn errors_map_to_statuses_in_one_place() {
    let cases = [
        (
            ModelError::InvalidRequest("x".into()),
            tonic::Code::InvalidArgument,
        ),
        (
            ModelError::Script(ScriptError::NoTurns),
            tonic::Code::InvalidArgument,
        ),
        (ModelError::NoModel, tonic::Code::FailedPrecondition),
        (
            ModelError::NoSuchTurn { turn: 3, turns: 2 },
            tonic::Code::FailedPrecondition,
        ),
        (
            ModelError::Provider("quota".into()),
            tonic::Code::Unavailable,
        ),
    ];
    agentloop_proto::testing::assert_codes(cases);
    assert_eq!(
        ModelError::NoSuchTurn { turn: 3, turns: 2 }.to_string(),
        "scripted model has no turn 3 (it has 2 turns and repeat_last is false)"
    );
}

#[tokio::test]
async fn a_final_answer_carries_its_evidence_into_the_decision() {
    use agentloop_decision::{Model, Proposal};
    use agentloop_engine::ProposedDecision;
    use agentloop_proto::v1::DecideRequest;

    let model = parse(
        r#"{"turns": [
            {"final": "profile=active", "evidence": ["l1", "l2", "l1"]},
            {"final": "no citations", "evidence": []}
        ]}"#,
    );
    assert_eq!(
        model.turns()[0].decision,
        ScriptedDecision::Final {
            answer: "profile=active".into(),
            evidence: vec!["l1".into(), "l2".into(), "l1".into()],
        }
    );
    assert_eq!(model.turns()[1].decision, final_answer("no citations"));
    let request = DecideRequest {
        invocation_id: "inv-1".into(),
        turn: 1,
        ..DecideRequest::default()
    };
    let reply = model.decide(&request).await.unwrap();
    assert_eq!(
        reply.proposal,
        Proposal::Decision(ProposedDecision::Final {
            answer: "profile=active".into(),
            // As written: dropping the repeat is the engine's business.
            evidence: vec!["l1".into(), "l2".into(), "l1".into()],
        })
    );
}

#[test]
fn evidence_without_a_final_answer_or_beyond_the_bounds_is_refused() {
    let bounds = agentloop_engine::DecisionBounds::default();
    assert_eq!(
        error(
            r#"{"turns": [{"final": "a"}, {"tool_calls": [{"id": "a", "name": "t", "arguments": {}}], "evidence": ["a"]}]}"#
        ),
        ScriptError::EvidenceWithoutFinal { index: 1 }
    );
    let alone = error(r#"{"turns": [{"evidence": ["l1"]}]}"#);
    assert_eq!(alone, ScriptError::EvidenceWithoutFinal { index: 0 });
    assert!(
        alone
            .to_string()
            .starts_with("$.turns[0].evidence: only a final answer carries evidence"),
        "{alone}"
    );
    assert_eq!(
        error(r#"{"turns": [{"cannot_continue": "no", "evidence": []}]}"#),
        ScriptError::EvidenceWithoutFinal { index: 0 }
    );
    assert_eq!(
        error(r#"{"turns": [{"final": "a", "evidence": ["l1", " "]}]}"#),
        ScriptError::EmptyEvidenceId {
            index: 0,
            position: 1
        }
    );
    let long = "x".repeat(bounds.max_call_id_bytes + 1);
    assert_eq!(
        error(&format!(
            r#"{{"turns": [{{"final": "a", "evidence": ["{long}"]}}]}}"#
        )),
        ScriptError::EvidenceIdTooLong {
            index: 0,
            position: 0,
            bytes: bounds.max_call_id_bytes + 1,
            limit: bounds.max_call_id_bytes,
        }
    );
    let ids = |n: usize| {
        let id = format!(r#""{}""#, "x".repeat(bounds.max_call_id_bytes));
        vec![id; n].join(",")
    };
    assert_eq!(
        error(&format!(
            r#"{{"turns": [{{"final": "a", "evidence": [{}]}}]}}"#,
            ids(bounds.max_evidence + 1)
        )),
        ScriptError::TooMuchEvidence {
            index: 0,
            cited: bounds.max_evidence + 1,
            limit: bounds.max_evidence,
        }
    );
    let at_limit = parse(&format!(
        r#"{{"turns": [{{"final": "a", "evidence": [{}]}}]}}"#,
        ids(bounds.max_evidence)
    ));
    assert!(matches!(
        &at_limit.turns()[0].decision,
        ScriptedDecision::Final { evidence, .. } if evidence.len() == bounds.max_evidence
    ));
    let message = error(r#"{"turns": [{"final": "a", "evidence": "l1"}]}"#).to_string();
    assert!(
        message.contains("$.turns[0]: invalid type: string \"l1\", expected a sequence"),
        "{message}"
    );
}
