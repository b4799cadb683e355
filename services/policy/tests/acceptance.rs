#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Acceptance rules as a library: citations, the ledger's word on writes, required
//! evidence with conditions, and the configuration format as written in the docs.

use std::collections::BTreeMap;

use agentloop_policy::{Acceptance, AcceptanceRules, PolicyError};
use agentloop_proto::v1::{
    CheckVerdict, CitedResult, Claim, EffectEntry, EffectState, ErrorType, ToolError, ToolOutput,
    ToolResult, ValidateFinalRequest, ValidateFinalResponse, tool_result::Outcome,
};

const TOOLS: [&str; 2] = ["lookup", "transfer"];

/// The profile `default` with `toml` as its `[acceptance.default]` table.
fn rules(toml: &str) -> AcceptanceRules {
    try_rules(toml).unwrap()
}

fn try_rules(toml: &str) -> Result<AcceptanceRules, PolicyError> {
    let acceptance: Acceptance = toml::from_str(toml).unwrap();
    AcceptanceRules::compile(&BTreeMap::from([("default".to_owned(), acceptance)]), TOOLS)
}

fn output(id: &str, tool: &str, json: &str) -> CitedResult {
    cited(
        id,
        tool,
        Outcome::Output(ToolOutput {
            output_json: json.into(),
            receipt: String::new(),
        }),
    )
}

fn cited(id: &str, tool: &str, outcome: Outcome) -> CitedResult {
    CitedResult {
        call_id: id.into(),
        turn: 1,
        tool: tool.into(),
        arguments_json: "{}".into(),
        result: Some(ToolResult {
            call_id: id.into(),
            outcome: Some(outcome),
        }),
    }
}

fn effect(call_id: &str, state: EffectState) -> EffectEntry {
    EffectEntry {
        invocation_id: "inv-1".into(),
        call_id: call_id.into(),
        effect_key: format!("key-{call_id}"),
        tool: "transfer".into(),
        state: state.into(),
        detail: "insufficient funds".into(),
        ..EffectEntry::default()
    }
}

fn claim(evidence: &[&str], cited: Vec<CitedResult>, effects: Vec<EffectEntry>) -> Claim {
    Claim {
        invocation_id: "inv-1".into(),
        answer: "done".into(),
        evidence: evidence.iter().map(|s| (*s).to_owned()).collect(),
        cited,
        effects,
        ..Claim::default()
    }
}

fn judge(rules: &AcceptanceRules, claim: Claim) -> ValidateFinalResponse {
    rules
        .validate(&ValidateFinalRequest {
            profile: "default".into(),
            claim: Some(claim),
        })
        .unwrap()
}

fn verdict_of(response: &ValidateFinalResponse, name: &str) -> CheckVerdict {
    response
        .checks
        .iter()
        .find(|check| check.name == name)
        .unwrap_or_else(|| panic!("no check {name}: {:?}", response.checks))
        .verdict()
}

#[test]
fn a_plain_answer_passes_the_defaults_and_an_empty_one_does_not() {
    let defaults = AcceptanceRules::default();
    let accepted = judge(&defaults, claim(&[], vec![], vec![]));
    assert!(accepted.accepted, "{:?}", accepted.reasons);
    assert_eq!(accepted.checks.len(), 1, "only the answer rule applies");
    let mut empty = claim(&[], vec![], vec![]);
    empty.answer = " \n".into();
    let refused = judge(&defaults, empty);
    assert!(!refused.accepted);
    assert_eq!(refused.reasons, vec!["answer: the answer is empty"]);
}

#[test]
fn every_citation_must_be_a_committed_output_of_this_invocation() {
    let defaults = AcceptanceRules::default();
    let good = output("l1", "lookup", r#"{"value":"active"}"#);
    let accepted = judge(&defaults, claim(&["l1"], vec![good.clone()], vec![]));
    assert!(accepted.accepted, "{:?}", accepted.reasons);
    let citations = accepted
        .checks
        .iter()
        .find(|c| c.name == "citations")
        .unwrap();
    assert_eq!(citations.evidence, vec!["l1"]);

    // Cited, but nothing of that ID was committed.
    let missing = judge(&defaults, claim(&["l1", "l9"], vec![good.clone()], vec![]));
    assert!(!missing.accepted);
    assert_eq!(verdict_of(&missing, "citations"), CheckVerdict::Rejected);
    assert!(
        missing.reasons[0].contains("\"l9\" is not a call with a committed result"),
        "{:?}",
        missing.reasons
    );

    // Cited, but its result is an error.
    let failed = cited(
        "l2",
        "lookup",
        Outcome::Error(ToolError {
            error_type: ErrorType::NotFound.into(),
            message: "no such key".into(),
            ..ToolError::default()
        }),
    );
    let error = judge(&defaults, claim(&["l2"], vec![failed], vec![]));
    assert!(!error.accepted);
    assert!(
        error.reasons[0].contains("ERROR_TYPE_NOT_FOUND: no such key"),
        "{:?}",
        error.reasons
    );
    assert!(error.reasons[0].contains("not an output"));
}

#[test]
fn with_require_citations_an_answer_that_cites_nothing_is_refused() {
    let strict = rules("require_citations = true");
    let refused = judge(&strict, claim(&[], vec![], vec![]));
    assert!(!refused.accepted);
    assert!(
        refused.reasons[0].contains("no evidence, no success"),
        "{:?}",
        refused.reasons
    );
    let cited = judge(
        &strict,
        claim(&["l1"], vec![output("l1", "lookup", "{}")], vec![]),
    );
    assert!(cited.accepted, "{:?}", cited.reasons);
}

#[test]
fn the_ledger_is_the_authority_on_writes() {
    let defaults = AcceptanceRules::default();
    let committed = judge(
        &defaults,
        claim(&[], vec![], vec![effect("t1", EffectState::Committed)]),
    );
    assert!(committed.accepted, "{:?}", committed.reasons);
    assert_eq!(
        committed
            .checks
            .iter()
            .find(|c| c.name == "writes")
            .unwrap()
            .evidence,
        vec!["key-t1"]
    );

    // The model says the refund is done; the ledger says the write was rejected.
    for state in [
        EffectState::Rejected,
        EffectState::OutcomeUnknown,
        EffectState::Dispatched,
        EffectState::Prepared,
        EffectState::ReconciliationRequired,
    ] {
        let effects = vec![effect("t0", EffectState::Committed), effect("t1", state)];
        let refused = judge(&defaults, claim(&[], vec![], effects));
        assert!(!refused.accepted, "{state:?}");
        assert_eq!(verdict_of(&refused, "writes"), CheckVerdict::Rejected);
        assert!(
            refused.reasons[0].contains("\"t1\" (transfer)"),
            "{:?}",
            refused.reasons
        );
    }

    // A profile may let rejected writes pass (the model reports a refusal), never
    // unknown ones; or not consult the ledger at all.
    let settled = rules(r#"writes = "settled""#);
    assert!(
        judge(
            &settled,
            claim(&[], vec![], vec![effect("t1", EffectState::Rejected)])
        )
        .accepted
    );
    assert!(
        !judge(
            &settled,
            claim(&[], vec![], vec![effect("t1", EffectState::OutcomeUnknown)])
        )
        .accepted
    );
    let unchecked = rules(r#"writes = "unchecked""#);
    let response = judge(
        &unchecked,
        claim(&[], vec![], vec![effect("t1", EffectState::Rejected)]),
    );
    assert!(response.accepted);
    assert!(response.checks.iter().all(|c| c.name != "writes"));
}

#[test]
fn a_send_that_asked_a_person_is_not_a_write_of_its_own() {
    let defaults = AcceptanceRules::default();
    let asked = EffectEntry {
        detail: agentloop_effects::settle::ASKED_FOR_INPUT.into(),
        ..effect("t1", EffectState::Rejected)
    };
    // Sent again with the answer: that send is the write the rule checks.
    let answered = EffectEntry {
        effect_key: "key-t1-answered".into(),
        ..effect("t1", EffectState::Committed)
    };
    let accepted = judge(&defaults, claim(&[], vec![], vec![asked.clone(), answered]));
    assert!(accepted.accepted, "{:?}", accepted.reasons);
    assert_eq!(
        accepted
            .checks
            .iter()
            .find(|c| c.name == "writes")
            .unwrap()
            .evidence,
        vec!["key-t1-answered"]
    );
    // The answered send rejected: refused, as any rejected write.
    let rejected = EffectEntry {
        effect_key: "key-t1-answered".into(),
        ..effect("t1", EffectState::Rejected)
    };
    assert!(!judge(&defaults, claim(&[], vec![], vec![asked.clone(), rejected])).accepted);
    // The same detail on a write that was not rejected is no exception.
    let committed = EffectEntry {
        detail: agentloop_effects::settle::ASKED_FOR_INPUT.into(),
        ..effect("t1", EffectState::OutcomeUnknown)
    };
    assert!(!judge(&defaults, claim(&[], vec![], vec![committed])).accepted);
}

#[test]
fn required_evidence_with_conditions_is_checked_against_the_cited_outputs() {
    let strict = rules(
        r#"
        [[require]]
        tool = "transfer"
        where = [
          { pointer = "/status", equals = "done" },
          { pointer = "/receipt", matches = "^tx-[0-9]+$" },
          { pointer = "/error", exists = false },
        ]
        "#,
    );
    let done = output("t1", "transfer", r#"{"status":"done","receipt":"tx-42"}"#);
    let accepted = judge(&strict, claim(&["t1"], vec![done.clone()], vec![]));
    assert!(accepted.accepted, "{:?}", accepted.reasons);
    let check = accepted
        .checks
        .iter()
        .find(|c| c.name == "require:transfer")
        .unwrap();
    assert_eq!(check.evidence, vec!["t1"]);

    // Not cited at all: the transfer's output exists, but the answer does not rest on it.
    let uncited = judge(&strict, claim(&[], vec![], vec![]));
    assert!(!uncited.accepted);
    assert!(
        uncited.reasons[0]
            .contains("must cite a transfer result with an output where \"/status\" is \"done\""),
        "{:?}",
        uncited.reasons
    );
    assert!(uncited.reasons[0].ends_with("it cites none"));

    // Cited, but it says something else.
    for (json, why) in [
        (
            r#"{"status":"pending","receipt":"tx-1"}"#,
            r#""/status" is "pending""#,
        ),
        (
            r#"{"status":"done","receipt":"r-1"}"#,
            r#""/receipt" is "r-1""#,
        ),
        (r#"{"status":"done"}"#, r#"nothing is at "/receipt""#),
        (
            r#"{"status":"done","receipt":"tx-1","error":"x"}"#,
            r#"a value is at "/error""#,
        ),
        ("not json", "output is not JSON"),
    ] {
        let response = judge(
            &strict,
            claim(&["t1"], vec![output("t1", "transfer", json)], vec![]),
        );
        assert!(!response.accepted, "{json}");
        assert!(
            response.reasons.iter().any(|r| r.contains(why)),
            "{json}: {:?}",
            response.reasons
        );
    }

    // Another tool's output does not meet it; one matching output among several does.
    let lookup = output("l1", "lookup", r#"{"status":"done","receipt":"tx-1"}"#);
    assert!(!judge(&strict, claim(&["l1"], vec![lookup.clone()], vec![])).accepted);
    let pending = output("t0", "transfer", r#"{"status":"pending","receipt":"tx-1"}"#);
    let both = judge(&strict, claim(&["t0", "t1"], vec![pending, done], vec![]));
    assert!(both.accepted, "{:?}", both.reasons);
}

#[test]
fn invalid_rules_are_refused_at_setup_naming_the_profile() {
    for (toml, why) in [
        ("[[require]]\ntool = \"refund\"", "not registered"),
        (
            "[[require]]\ntool = \"transfer\"\nwhere = [{ pointer = \"status\", exists = true }]",
            "not a JSON pointer",
        ),
        (
            "[[require]]\ntool = \"transfer\"\nwhere = [{ pointer = \"/a\", matches = \"(\" }]",
            "not a valid expression",
        ),
        (
            "[[require]]\ntool = \"transfer\"\nwhere = [{ pointer = \"/a\", exists = true, equals = 1 }]",
            "exactly one of",
        ),
        (
            "[[require]]\ntool = \"transfer\"\nwhere = [{ pointer = \"/a\" }]",
            "exactly one of",
        ),
        (
            "verifiers = [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\", \"i\"]",
            "at most 8",
        ),
    ] {
        let error = try_rules(toml).unwrap_err();
        let PolicyError::Acceptance { profile, detail } = &error else {
            panic!("{toml}: {error:?}");
        };
        assert_eq!(profile, "default");
        assert!(detail.contains(why), "{toml}: {detail}");
    }
    assert!(toml::from_str::<Acceptance>("writes = \"sometimes\"").is_err());
    assert!(
        toml::from_str::<Acceptance>("require_evidence = true").is_err(),
        "unknown keys are refused"
    );
}

#[test]
fn the_profile_names_its_verifiers_and_other_profiles_get_the_defaults() {
    let with = rules(r#"verifiers = ["transfer_recorded"]"#);
    let response = judge(&with, claim(&[], vec![], vec![]));
    assert_eq!(response.verifiers, vec!["transfer_recorded"]);
    let other = with
        .validate(&ValidateFinalRequest {
            profile: "batch".into(),
            claim: Some(claim(&[], vec![], vec![])),
        })
        .unwrap();
    assert!(other.accepted && other.verifiers.is_empty());
}

#[test]
fn malformed_claims_are_invalid_requests() {
    let defaults = AcceptanceRules::default();
    let invalid = |request: ValidateFinalRequest| {
        matches!(
            defaults.validate(&request),
            Err(PolicyError::InvalidRequest(_))
        )
    };
    assert!(invalid(ValidateFinalRequest {
        profile: "default".into(),
        claim: None
    }));
    let mut no_id = claim(&[], vec![], vec![]);
    no_id.invocation_id.clear();
    assert!(invalid(ValidateFinalRequest {
        profile: "default".into(),
        claim: Some(no_id)
    }));
    let effects = (0..1025)
        .map(|i| effect(&format!("t{i}"), EffectState::Committed))
        .collect();
    assert!(invalid(ValidateFinalRequest {
        profile: "default".into(),
        claim: Some(claim(&[], vec![], effects)),
    }));
}
