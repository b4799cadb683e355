//! The Cedar engine over real policy text: decisions, deciding policies, approvals,
//! and the policy sets that must not load.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use agentloop_authz::{
    Authorizer, BatchContext, CallDecision, CallRequest, Cedar, Effect, LoadError, Principal,
    Source, ToolFacts,
};
use serde_json::{Value, json};

const TRANSFER_SCHEMA: &str = r#"{"type": "object", "properties": {
    "from": {"type": "string"}, "to": {"type": "string"}, "amount": {"type": "integer"}}}"#;
const LOOKUP_SCHEMA: &str = r#"{"type": "object", "properties": {"key": {"type": "string"}}}"#;
const EXPORT_SCHEMA: &str = r#"{"type": "object", "properties": {
    "tenant": {"type": "string"}, "rows": {"type": "integer"}}}"#;

fn tools() -> Vec<ToolFacts<'static>> {
    vec![
        ToolFacts {
            name: "lookup",
            side_effect: "read_only",
            requires_approval: false,
            input_schema: LOOKUP_SCHEMA,
        },
        ToolFacts {
            name: "transfer",
            side_effect: "write",
            requires_approval: false,
            input_schema: TRANSFER_SCHEMA,
        },
        ToolFacts {
            name: "export",
            side_effect: "read_only",
            requires_approval: false,
            input_schema: EXPORT_SCHEMA,
        },
    ]
}

fn demo() -> Cedar {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/policies/demo.cedar"
    ))
    .unwrap();
    let tenants = r#"
        @id("exports-within-tenant")
        permit(principal, action, resource == Agentloop::Tool::"export");
        @id("no-cross-tenant-exports")
        forbid(principal, action, resource)
        when { context.arguments has tenant && context.arguments.tenant != principal.tenant };
        @id("admins-do-anything")
        permit(principal, action, resource) when { principal.roles.contains("admin") };
    "#;
    Cedar::compile(
        &[
            Source {
                name: "deploy/policies/demo.cedar".into(),
                text,
            },
            Source {
                name: "tenants.cedar".into(),
                text: tenants.into(),
            },
        ],
        &tools(),
    )
    .unwrap()
}

fn judge(
    cedar: &Cedar,
    roles: &[&str],
    tenant: &str,
    tool: &str,
    arguments: Value,
    approved: bool,
) -> CallDecision {
    let roles: Vec<String> = roles.iter().map(|r| (*r).to_owned()).collect();
    let batch = BatchContext {
        principal: Principal {
            actor: "ana",
            tenant,
            roles: &roles,
        },
        profile: "default",
        approved,
        turn: 1,
    };
    let mut decisions = cedar.authorize(
        &batch,
        &[CallRequest {
            tool,
            arguments: &arguments,
        }],
    );
    assert_eq!(decisions.len(), 1);
    decisions.remove(0)
}

fn decided(effect: Effect, policies: &[&str]) -> CallDecision {
    CallDecision {
        effect,
        policies: policies.iter().map(|p| (*p).to_owned()).collect(),
        errors: Vec::new(),
    }
}

#[test]
fn the_matrix_of_actors_tenants_tools_and_amounts() {
    let cedar = demo();
    let cases: &[(&[&str], &str, &str, Value, CallDecision)] = &[
        (
            &[],
            "acme",
            "lookup",
            json!({"key": "k"}),
            decided(Effect::Allow, &["lookup-for-everyone"]),
        ),
        (
            &[],
            "acme",
            "transfer",
            json!({"from": "a", "to": "b", "amount": 100}),
            decided(Effect::Deny, &[]),
        ),
        (
            &["clerk"],
            "acme",
            "transfer",
            json!({"from": "a", "to": "b", "amount": 10_000}),
            decided(Effect::Allow, &["small-transfers-for-clerks"]),
        ),
        (
            &["clerk"],
            "acme",
            "transfer",
            json!({"from": "a", "to": "b", "amount": 10_001}),
            decided(Effect::RequireApproval, &["large-transfers-need-approval"]),
        ),
        // An unannotated permit does not lift the approval an annotated one asks for.
        (
            &["clerk", "admin"],
            "acme",
            "transfer",
            json!({"from": "a", "to": "b", "amount": 50_000}),
            decided(Effect::RequireApproval, &["large-transfers-need-approval"]),
        ),
        (
            &["admin"],
            "acme",
            "transfer",
            json!({"from": "a", "to": "b", "amount": 50_000}),
            decided(Effect::Allow, &["admins-do-anything"]),
        ),
        (
            &["clerk", "admin"],
            "acme",
            "transfer",
            json!({"from": "reserve", "to": "b", "amount": 5}),
            decided(Effect::Deny, &["reserve-is-untouchable"]),
        ),
        (
            &[],
            "acme",
            "export",
            json!({"tenant": "acme", "rows": 5}),
            decided(Effect::Allow, &["exports-within-tenant"]),
        ),
        // Cross-tenant: the forbid wins over every permit, the admin's too.
        (
            &["admin"],
            "acme",
            "export",
            json!({"tenant": "globex", "rows": 5}),
            decided(Effect::Deny, &["no-cross-tenant-exports"]),
        ),
        (
            &["admin"],
            "globex",
            "export",
            json!({"tenant": "globex"}),
            decided(
                Effect::Allow,
                &["admins-do-anything", "exports-within-tenant"],
            ),
        ),
    ];
    for (roles, tenant, tool, arguments, expected) in cases {
        let got = judge(&cedar, roles, tenant, tool, arguments.clone(), false);
        assert_eq!(
            &got, expected,
            "{roles:?} in {tenant} calls {tool} with {arguments}"
        );
    }
}

#[test]
fn one_batch_gets_one_decision_per_call_in_order() {
    let cedar = demo();
    let roles = vec!["clerk".to_owned()];
    let batch = BatchContext {
        principal: Principal {
            actor: "ana",
            tenant: "acme",
            roles: &roles,
        },
        profile: "p",
        approved: false,
        turn: 3,
    };
    let (small, large, lookup) = (
        json!({"amount": 1}),
        json!({"amount": 20_000}),
        json!({"key": "k"}),
    );
    let calls = [
        CallRequest {
            tool: "transfer",
            arguments: &small,
        },
        CallRequest {
            tool: "transfer",
            arguments: &large,
        },
        CallRequest {
            tool: "lookup",
            arguments: &lookup,
        },
    ];
    let effects: Vec<Effect> = cedar
        .authorize(&batch, &calls)
        .into_iter()
        .map(|d| d.effect)
        .collect();
    assert_eq!(
        effects,
        [Effect::Allow, Effect::RequireApproval, Effect::Allow]
    );
}

#[test]
fn arguments_cedar_cannot_hold_are_refused_never_allowed() {
    let cedar = demo();
    let decision = judge(
        &cedar,
        &["admin"],
        "acme",
        "transfer",
        json!({"amount": u64::MAX}),
        false,
    );
    assert_eq!(decision.effect, Effect::Deny);
    assert!(
        decision.errors[0].contains("beyond Cedar's 64-bit integer range"),
        "{decision:?}"
    );
    let unknown = judge(&cedar, &["admin"], "acme", "nope", json!({}), false);
    assert_eq!(unknown.effect, Effect::Deny);
}

#[test]
fn approval_in_the_context_lets_policies_speak_of_it() {
    let text = r#"
        @id("only-approved")
        permit(principal, action, resource == Agentloop::Tool::"transfer") when { context.approved };
    "#;
    let cedar = Cedar::compile(
        &[Source {
            name: "a.cedar".into(),
            text: text.into(),
        }],
        &tools(),
    )
    .unwrap();
    assert_eq!(
        judge(&cedar, &[], "acme", "transfer", json!({}), false).effect,
        Effect::Deny
    );
    assert_eq!(
        judge(&cedar, &[], "acme", "transfer", json!({}), true).effect,
        Effect::Allow
    );
}

#[test]
fn an_evaluation_error_denies_and_names_the_policy() {
    // Strict validation leaves few run-time errors; an integer overflow is one.
    let text = r#"
        @id("overflow")
        forbid(principal, action, resource) when { context.arguments has amount && context.arguments.amount * 2 < 0 };
        @id("all")
        permit(principal, action, resource);
    "#;
    let cedar = Cedar::compile(
        &[Source {
            name: "e.cedar".into(),
            text: text.into(),
        }],
        &tools(),
    )
    .unwrap();
    let decision = judge(
        &cedar,
        &[],
        "acme",
        "transfer",
        json!({"amount": i64::MAX}),
        false,
    );
    assert_eq!(decision.effect, Effect::Deny);
    assert_eq!(decision.policies, ["overflow"]);
    assert!(decision.errors[0].contains("overflow"), "{decision:?}");
    // Without the overflow, the forbid is simply not satisfied.
    assert_eq!(
        judge(&cedar, &[], "acme", "transfer", json!({"amount": 5}), false).effect,
        Effect::Allow
    );
}

fn refused(text: &str) -> Vec<String> {
    let error = Cedar::compile(
        &[Source {
            name: "bad.cedar".into(),
            text: text.into(),
        }],
        &tools(),
    )
    .unwrap_err();
    assert!(matches!(error, LoadError::Policies(_)), "{error}");
    error.problems().iter().map(ToString::to_string).collect()
}

#[test]
fn policies_that_do_not_validate_do_not_load_and_say_where() {
    let problems = refused(
        "permit(principal, action, resource);\n@id(\"dept\")\npermit(principal, action, resource)\n  when { principal.department == \"sales\" };\n",
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with("bad.cedar:4:"), "{problems:?}");
    assert!(problems[0].contains("policy dept"), "{problems:?}");
    assert!(problems[0].contains("department"), "{problems:?}");

    // An argument no tool declares; a declared one read without `has`.
    let problems = refused(
        "permit(principal, action, resource) when { context.arguments.colour == \"red\" };",
    );
    assert!(
        problems[0].contains("bad.cedar#0") && problems[0].contains("colour"),
        "{problems:?}"
    );
    let problems =
        refused("permit(principal, action, resource) when { context.arguments.amount > 5 };");
    assert!(problems[0].contains("amount"), "{problems:?}");

    let problems = refused("permit(principal, action, resource) when { principal.tenant == };");
    assert!(problems[0].starts_with("bad.cedar:1:"), "{problems:?}");

    let problems = refused(
        "@id(\"x\") permit(principal, action, resource);\n@id(\"x\") forbid(principal, action, resource);",
    );
    assert!(
        problems[0].contains("policy x: this policy ID is used twice"),
        "{problems:?}"
    );

    let problems = refused("@approval forbid(principal, action, resource);");
    assert!(problems[0].contains("permit policies only"), "{problems:?}");
    let problems = refused("@approval(\"maybe\") permit(principal, action, resource);");
    assert!(problems[0].contains("@approval takes"), "{problems:?}");
}

#[test]
fn the_version_follows_the_text_and_the_schema_names_every_argument() {
    let source = |text: &str| Source {
        name: "v.cedar".into(),
        text: text.into(),
    };
    let a = Cedar::compile(&[source("permit(principal, action, resource);")], &tools()).unwrap();
    let b = Cedar::compile(&[source("permit(principal, action, resource);")], &tools()).unwrap();
    let c = Cedar::compile(&[source("forbid(principal, action, resource);")], &tools()).unwrap();
    assert_eq!(a.version(), b.version());
    assert_ne!(a.version(), c.version());
    assert_eq!(a.version().len(), 32);
    assert!(a.schema().contains(r#"type Arguments = { "amount"?: Long, "from"?: String, "key"?: String, "rows"?: Long, "tenant"?: String, "to"?: String };"#), "{}", a.schema());
}
