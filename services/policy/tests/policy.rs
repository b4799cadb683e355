#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]
//! ToolPolicy as a library: violations, approvals, gates.

use agentloop_engine::{Fingerprint, canonical_json};
use agentloop_policy::{
    MAX_CALLS, MAX_SCHEMA_VIOLATIONS_PER_CALL, PolicyConfig, PolicyError, PolicyServer,
    ProfilePolicies, ToolPolicy,
};

/// Authorization off: these tests judge structure, schemas and gates.
const OFF: ProfilePolicies = ProfilePolicies::Off;
use agentloop_proto::v1::{
    self, EvaluateRequest, EvaluateResponse, ToolCall, ToolDescriptor, Verdict,
};

const LOOKUP_SCHEMA: &str = r#"{
    "type": "object",
    "properties": {
        "key": {"type": "string"},
        "limit": {"type": "integer", "minimum": 1},
        "tags": {"type": "array", "items": {"type": "string"}}
    },
    "required": ["key"],
    "additionalProperties": false
}"#;

fn tool(
    name: &str,
    side_effect: v1::SideEffect,
    commutative: bool,
    schema: &str,
) -> ToolDescriptor {
    ToolDescriptor {
        name: name.into(),
        description: format!("the {name} tool"),
        input_schema_json: schema.into(),
        side_effect: side_effect.into(),
        commutative,
        ..ToolDescriptor::default()
    }
}

fn descriptors() -> Vec<ToolDescriptor> {
    vec![
        tool("lookup", v1::SideEffect::ReadOnly, false, LOOKUP_SCHEMA),
        tool(
            "write",
            v1::SideEffect::Write,
            false,
            r#"{"type": "object"}"#,
        ),
        tool("tag", v1::SideEffect::IdempotentWrite, true, ""),
        tool("legacy", v1::SideEffect::Unspecified, true, ""),
        tool(
            "pay",
            v1::SideEffect::Write,
            false,
            r#"{"type":"object","required":["amount"]}"#,
        ),
    ]
}

fn policy() -> ToolPolicy {
    ToolPolicy::new(&descriptors())
        .unwrap()
        .with_approval_gates(["pay".to_owned()])
}

fn call(id: &str, tool: &str, args: &str) -> ToolCall {
    ToolCall {
        call_id: id.into(),
        tool: tool.into(),
        arguments_json: args.into(),
    }
}

fn request(calls: Vec<ToolCall>) -> EvaluateRequest {
    EvaluateRequest {
        invocation_id: "inv-1".into(),
        turn: 1,
        calls,
        ..EvaluateRequest::default()
    }
}

fn evaluate(calls: Vec<ToolCall>) -> EvaluateResponse {
    policy().evaluate_request(request(calls), &OFF).unwrap()
}

fn denied(calls: Vec<ToolCall>) -> Vec<(String, String)> {
    let response = evaluate(calls);
    assert_eq!(response.verdict(), Verdict::Deny, "{response:?}");
    response
        .violations
        .into_iter()
        .map(|v| (v.call_id, v.message))
        .collect()
}

#[test]
fn schema_violations_name_the_json_pointer() {
    let violations = denied(vec![
        call("ok", "lookup", r#"{"key": "a"}"#),
        call(
            "bad",
            "lookup",
            r#"{"key": 5, "limit": 0, "tags": ["x", 7], "extra": true}"#,
        ),
    ]);
    assert!(
        violations.iter().all(|(id, _)| id == "bad"),
        "{violations:?}"
    );
    let messages: Vec<&str> = violations.iter().map(|(_, m)| m.as_str()).collect();
    let has = |prefix: &str, word: &str| {
        messages
            .iter()
            .any(|m| m.starts_with(prefix) && m.contains(word))
    };
    assert!(has("arguments at /key: ", "string"), "{messages:?}");
    assert!(has("arguments at /limit: ", "1"), "{messages:?}");
    assert!(has("arguments at /tags/1: ", "string"), "{messages:?}");
    assert!(has("arguments at /: ", "extra"), "{messages:?}");
    assert_eq!(messages.len(), 4, "{messages:?}");

    let missing = denied(vec![call("m", "lookup", "{}")]);
    assert_eq!(missing.len(), 1);
    assert!(
        missing[0].1.starts_with("arguments at /: ") && missing[0].1.contains("key"),
        "{missing:?}"
    );
}

#[test]
fn schema_violations_are_bounded_per_call() {
    let properties: Vec<String> = (0..30).map(|i| format!("\"p{i}\"")).collect();
    let schema = format!(
        r#"{{"type":"object","required":[{}]}}"#,
        properties.join(",")
    );
    let policy =
        ToolPolicy::new(&[tool("wide", v1::SideEffect::ReadOnly, false, &schema)]).unwrap();
    let response = policy
        .evaluate_request(request(vec![call("w", "wide", "{}")]), &OFF)
        .unwrap();
    assert_eq!(response.verdict(), Verdict::Deny);
    assert_eq!(
        response.violations.len(),
        MAX_SCHEMA_VIOLATIONS_PER_CALL + 1
    );
    assert!(
        response
            .violations
            .last()
            .unwrap()
            .message
            .contains("more schema violations not shown")
    );
}

#[test]
fn unknown_tools_and_bad_arguments_are_refused() {
    let violations = denied(vec![
        call("a", "nope", "{}"),
        call("b", "lookup", r#"["key"]"#),
        call("c", "lookup", r#""key""#),
        call("d", "lookup", r#"{"key": "#),
        call("e", "write", "null"),
        call("f", "tag", "{}"),
    ]);
    let find = |id: &str| -> Vec<&str> {
        violations
            .iter()
            .filter(|(c, _)| c == id)
            .map(|(_, m)| m.as_str())
            .collect()
    };
    assert_eq!(find("a"), vec![r#"unknown tool "nope""#]);
    assert_eq!(
        find("b"),
        vec!["arguments must be a JSON object, not an array"]
    );
    assert_eq!(
        find("c"),
        vec!["arguments must be a JSON object, not a string"]
    );
    assert_eq!(find("d").len(), 1);
    assert!(
        find("d")[0].starts_with("arguments are not valid JSON: "),
        "{:?}",
        find("d")
    );
    assert_eq!(find("e"), vec!["arguments must be a JSON object, not null"]);
    assert!(
        find("f").is_empty(),
        "a good call in a bad batch has no violation"
    );
}

#[test]
fn batch_structure_is_checked() {
    assert_eq!(
        denied(vec![]),
        vec![(String::new(), "the tool-call batch is empty".to_owned())]
    );
    let violations = denied(vec![
        call("x", "lookup", r#"{"key":"a"}"#),
        call("x", "lookup", r#"{"key":"b"}"#),
        call("", "lookup", r#"{"key":"c"}"#),
    ]);
    assert_eq!(
        violations,
        vec![
            (
                String::new(),
                r#"call ID "x" is used more than once"#.to_owned()
            ),
            (
                String::new(),
                r#"call 2 (tool "lookup") has no call ID"#.to_owned()
            ),
        ]
    );
}

#[test]
fn batches_of_every_side_effect_are_allowed_alike() {
    let read = |id: &str| call(id, "lookup", r#"{"key":"k"}"#);
    let write = |id: &str| call(id, "write", "{}");
    let tag = |id: &str| call(id, "tag", r#"{"t":1}"#);
    let legacy = |id: &str| call(id, "legacy", "{}");
    let cases: Vec<Vec<ToolCall>> = vec![
        vec![read("r1"), read("r2"), read("r3")],
        vec![read("r1"), read("r2"), write("w1"), write("w2"), read("r3")],
        vec![tag("t1"), tag("t2"), read("r1"), tag("t3")],
        vec![legacy("l1"), legacy("l2"), read("r1")],
    ];
    for calls in cases {
        let response = evaluate(calls);
        assert_eq!(response.verdict(), Verdict::Allow, "{response:?}");
        assert!(response.violations.is_empty());
        assert!(response.proposal_digest.is_empty());
    }
}

#[test]
fn a_tool_whose_descriptor_requires_approval_is_gated_without_configuration() {
    let mut tools = descriptors();
    tools[0].requires_approval = true;
    let name = tools[0].name.clone();
    let gated = ToolPolicy::new(&tools).unwrap();
    let response = gated.evaluate_request(request(vec![call("c", &name, r#"{"key":"k"}"#)]), &OFF);
    assert_eq!(response.unwrap().verdict(), Verdict::RequireApproval);
    // Without the flag, the same call runs.
    let open = ToolPolicy::new(&descriptors()).unwrap();
    let response = open.evaluate_request(request(vec![call("c", &name, r#"{"key":"k"}"#)]), &OFF);
    assert_eq!(response.unwrap().verdict(), Verdict::Allow);
}

#[test]
fn approval_gates_bind_the_engines_digest() {
    let first = vec![
        call("p1", "pay", r#"{"amount": 5, "to": {"b": 1, "a": 2}}"#),
        call("r1", "lookup", r#"{"key":"k"}"#),
    ];
    let response = evaluate(first.clone());
    assert_eq!(response.verdict(), Verdict::RequireApproval, "{response:?}");
    let expected = Fingerprint::of_calls([
        (
            "pay",
            canonical_json(&serde_json::from_str(r#"{"amount":5,"to":{"a":2,"b":1}}"#).unwrap())
                .as_str(),
        ),
        ("lookup", r#"{"key":"k"}"#),
    ])
    .to_string();
    assert_eq!(response.proposal_digest, expected);
    assert_eq!(response.proposal_digest.len(), 64);
    // The gated call is named, for the approver and the model; the other is not.
    assert_eq!(response.violations.len(), 1);
    assert_eq!(response.violations[0].call_id, "p1");
    assert!(
        response.violations[0]
            .message
            .contains("pay need a human approval")
    );
    assert!(
        response
            .proposal_digest
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    );

    // Same calls, other IDs, other order, reordered keys and white space: same digest.
    let reordered = vec![
        call("x", "lookup", r#"{ "key" : "k" }"#),
        call("y", "pay", r#"{"to": {"a": 2, "b": 1}, "amount": 5}"#),
    ];
    assert_eq!(evaluate(reordered.clone()).proposal_digest, expected);
    // Different arguments: a different digest.
    let other = vec![call("p1", "pay", r#"{"amount": 6}"#)];
    assert_ne!(evaluate(other.clone()).proposal_digest, expected);

    // Running under the approval of exactly this proposal: allowed.
    let mut approved = request(reordered);
    approved.approved_proposal_digest = expected.clone();
    let response = policy().evaluate_request(approved, &OFF).unwrap();
    assert_eq!(response.verdict(), Verdict::Allow);
    // An approval of a different proposal does nothing.
    let mut wrong = request(other);
    wrong.approved_proposal_digest = expected;
    assert_eq!(
        policy().evaluate_request(wrong, &OFF).unwrap().verdict(),
        Verdict::RequireApproval
    );
    // A denied batch is denied even if it calls a gated tool.
    assert_eq!(
        evaluate(vec![call("p", "pay", "{}")]).verdict(),
        Verdict::Deny
    );
}

#[test]
fn malformed_requests_are_invalid_argument() {
    let mut no_id = request(vec![call("a", "lookup", r#"{"key":"k"}"#)]);
    no_id.invocation_id.clear();
    let error = policy().evaluate_request(no_id, &OFF).unwrap_err();
    assert_eq!(
        error,
        PolicyError::InvalidRequest("invocation_id is required".into())
    );

    let many: Vec<ToolCall> = (0..=MAX_CALLS)
        .map(|i| call(&format!("c{i}"), "lookup", "{}"))
        .collect();
    let error = policy().evaluate_request(request(many), &OFF).unwrap_err();
    assert!(
        error.to_string().contains("65 calls; at most 64"),
        "{error}"
    );

    let big = format!(r#"{{"key":"{}"}}"#, "x".repeat(1024 * 1024));
    let error = policy()
        .evaluate_request(request(vec![call("big", "lookup", &big)]), &OFF)
        .unwrap_err();
    assert!(
        matches!(error, PolicyError::InvalidRequest(ref m) if m.contains("\"big\"")),
        "{error}"
    );
}

#[test]
fn bad_descriptors_fail_construction_naming_the_tool() {
    let error = ToolPolicy::new(&[tool(
        "broken",
        v1::SideEffect::ReadOnly,
        false,
        r#"{"type": "nonsense"}"#,
    )])
    .unwrap_err();
    assert!(
        matches!(error, PolicyError::InvalidSchema { ref tool, .. } if tool == "broken"),
        "{error}"
    );
    let error =
        ToolPolicy::new(&[tool("text", v1::SideEffect::ReadOnly, false, "{not json")]).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with(r#"tool "text" has an invalid input schema: not JSON"#),
        "{error}"
    );
    let error = ToolPolicy::new(&[tool(
        "remote",
        v1::SideEffect::ReadOnly,
        false,
        r#"{"$ref": "https://example.invalid/schema.json"}"#,
    )])
    .unwrap_err();
    assert!(
        matches!(error, PolicyError::InvalidSchema { ref tool, .. } if tool == "remote"),
        "{error}"
    );
    let twice = [
        tool("a", v1::SideEffect::ReadOnly, false, ""),
        tool("a", v1::SideEffect::Write, false, ""),
    ];
    assert_eq!(
        ToolPolicy::new(&twice).unwrap_err(),
        PolicyError::DuplicateTool { tool: "a".into() }
    );
}

#[test]
fn config_wires_gates() {
    let config = PolicyConfig {
        require_approval_for: vec!["write".into()],
        ..PolicyConfig::default()
    };
    let server = PolicyServer::from_descriptors(&descriptors(), &config).unwrap();
    let response = server
        .evaluate(request(vec![call("w", "write", "{}")]))
        .unwrap();
    assert_eq!(response.verdict(), Verdict::RequireApproval);
    // `pay` is not gated by this config.
    let response = server
        .evaluate(request(vec![call("p", "pay", r#"{"amount":1}"#)]))
        .unwrap();
    assert_eq!(response.verdict(), Verdict::Allow);
}

#[test]
fn errors_map_to_statuses_in_one_place() {
    let cases = [
        (
            PolicyError::InvalidRequest("x".into()),
            tonic::Code::InvalidArgument,
        ),
        (
            PolicyError::InvalidSchema {
                tool: "t".into(),
                detail: "d".into(),
            },
            tonic::Code::FailedPrecondition,
        ),
        (
            PolicyError::DuplicateTool { tool: "t".into() },
            tonic::Code::FailedPrecondition,
        ),
        (PolicyError::NoToolSource, tonic::Code::FailedPrecondition),
        (
            PolicyError::ConflictingToolSources,
            tonic::Code::FailedPrecondition,
        ),
        (
            PolicyError::ToolsFile {
                path: "p".into(),
                detail: "d".into(),
            },
            tonic::Code::FailedPrecondition,
        ),
        (
            PolicyError::ToolsUnavailable {
                endpoint: "e".into(),
                attempts: 2,
                detail: "d".into(),
            },
            tonic::Code::Unavailable,
        ),
    ];
    agentloop_proto::testing::assert_codes(cases);
}
