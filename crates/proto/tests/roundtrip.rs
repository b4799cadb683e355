//! Every variant of the two closed sums on the wire (Decision and ToolResult) survives
//! an encode/decode round trip unchanged.

use agentloop_proto::v1::{
    Decision, ErrorType, NextAction, ToolCall, ToolError, ToolOutput, ToolResult, decision,
    tool_result,
};
use prost::Message;

fn call(id: &str) -> ToolCall {
    ToolCall {
        call_id: id.to_owned(),
        tool: "orders.lookup".to_owned(),
        // A 64-bit integer beyond f64 precision: JSON text keeps it exact.
        arguments_json: r#"{"order_id":9007199254740993}"#.to_owned(),
    }
}

/// Encodes and decodes `message`, returning what came back.
fn round_trip<M: Message + Default>(message: &M) -> Result<M, prost::DecodeError> {
    M::decode(message.encode_to_vec().as_slice())
}

#[test]
fn every_decision_kind_round_trips() {
    let kinds = [
        decision::Kind::Final(decision::Final {
            answer: "42".to_owned(),
            evidence: vec!["c1".to_owned()],
        }),
        decision::Kind::ToolCalls(decision::ToolCalls {
            calls: vec![call("c1"), call("c2")],
        }),
        decision::Kind::RequestApproval(decision::RequestApproval {
            summary: "refund order 7".to_owned(),
            calls: vec![call("c3")],
        }),
        decision::Kind::Clarification(decision::Clarification {
            question: "which order?".to_owned(),
        }),
        decision::Kind::CannotContinue(decision::CannotContinue {
            reason: "no access".to_owned(),
        }),
    ];
    for kind in kinds {
        let decision = Decision { kind: Some(kind) };
        assert_eq!(round_trip(&decision).expect("decodes"), decision);
    }
}

#[test]
fn every_tool_result_outcome_round_trips() {
    let outcomes = [
        tool_result::Outcome::Output(ToolOutput {
            output_json: r#"{"total":18446744073709551615}"#.to_owned(),
            receipt: "refund-77".to_owned(),
        }),
        tool_result::Outcome::Error(ToolError {
            error_type: ErrorType::Conflict.into(),
            message: "order changed".to_owned(),
            retryable: true,
            next_allowed_action: NextAction::Retry.into(),
        }),
        tool_result::Outcome::Cancelled(tool_result::Cancelled {
            reason: "lease lost".to_owned(),
        }),
        tool_result::Outcome::NotStarted(tool_result::NotStarted {
            reason: "earlier stage failed".to_owned(),
        }),
        tool_result::Outcome::Unknown(tool_result::OutcomeUnknown {
            detail: "connection reset after dispatch".to_owned(),
        }),
    ];
    for outcome in outcomes {
        let result = ToolResult {
            call_id: "c1".to_owned(),
            outcome: Some(outcome),
        };
        assert_eq!(round_trip(&result).expect("decodes"), result);
    }
}

#[test]
fn enum_values_decode_to_the_same_variant() {
    let error = ToolError {
        error_type: ErrorType::Rejected.into(),
        message: String::new(),
        retryable: false,
        next_allowed_action: NextAction::AskUser.into(),
    };
    let decoded = round_trip(&error).expect("decodes");
    assert_eq!(decoded.error_type(), ErrorType::Rejected);
    assert_eq!(decoded.next_allowed_action(), NextAction::AskUser);
}
