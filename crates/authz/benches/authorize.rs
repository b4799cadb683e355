//! One authorization decision with a 20-policy set: the cost policy adds to each call.
//!
//! `cargo bench -p agentloop-authz --bench authorize`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use agentloop_authz::{Authorizer, BatchContext, CallRequest, Cedar, Principal, Source, ToolFacts};
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

const TRANSFER: &str = r#"{"type": "object", "properties": {
    "from": {"type": "string"}, "to": {"type": "string"}, "amount": {"type": "integer"},
    "memo": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}}"#;
const LOOKUP: &str = r#"{"type": "object", "properties": {"key": {"type": "string"}}}"#;

/// Twenty policies of the shapes policy authors write: scoped permits by tool and role,
/// amount bands, approval gates, and forbids over arguments and tenants.
fn twenty_policies() -> String {
    let mut text = String::new();
    text.push_str(
        r#"@id("lookup") permit(principal, action, resource == Agentloop::Tool::"lookup");
@id("small") permit(principal, action, resource == Agentloop::Tool::"transfer")
  when { principal.roles.contains("clerk") && context.arguments has amount && context.arguments.amount <= 10000 };
@id("large") @approval permit(principal, action, resource == Agentloop::Tool::"transfer")
  when { principal.roles.contains("clerk") && context.arguments has amount && context.arguments.amount > 10000 };
@id("reserve") forbid(principal, action, resource == Agentloop::Tool::"transfer")
  when { context.arguments has from && context.arguments.from == "reserve" };
@id("tagged") forbid(principal, action, resource)
  when { context.arguments has tags && context.arguments.tags.contains("frozen") };
"#,
    );
    for n in 0..15 {
        text.push_str(&format!(
            "@id(\"tool-{n}\") permit(principal, action, resource == Agentloop::Tool::\"tool-{n}\") \
             when {{ principal.roles.contains(\"role-{n}\") && context.tenant == \"tenant-{n}\" }};\n"
        ));
    }
    text
}

fn authorize(c: &mut Criterion) {
    let names: Vec<String> = (0..15).map(|n| format!("tool-{n}")).collect();
    let mut tools = vec![
        ToolFacts {
            name: "lookup",
            side_effect: "read_only",
            requires_approval: false,
            input_schema: LOOKUP,
        },
        ToolFacts {
            name: "transfer",
            side_effect: "write",
            requires_approval: false,
            input_schema: TRANSFER,
        },
    ];
    tools.extend(names.iter().map(|name| ToolFacts {
        name,
        side_effect: "read_only",
        requires_approval: false,
        input_schema: LOOKUP,
    }));
    let cedar = Cedar::compile(
        &[Source {
            name: "bench.cedar".into(),
            text: twenty_policies(),
        }],
        &tools,
    )
    .expect("the bench policies load");
    assert_eq!(cedar.policy_ids().len(), 20);
    let roles = vec!["clerk".to_owned()];
    let batch = BatchContext {
        principal: Principal {
            actor: "ana",
            tenant: "acme",
            roles: &roles,
        },
        profile: "default",
        approved: false,
        turn: 3,
    };
    let arguments =
        json!({"from": "alice", "to": "bob", "amount": 5000, "memo": "rent", "tags": ["monthly"]});
    let call = [CallRequest {
        tool: "transfer",
        arguments: &arguments,
    }];
    c.bench_function("authorize one call, 20 policies", |b| {
        b.iter(|| cedar.authorize(std::hint::black_box(&batch), std::hint::black_box(&call)));
    });
    let key = json!({"key": "profile"});
    let lookups = [
        CallRequest {
            tool: "lookup",
            arguments: &key,
        },
        CallRequest {
            tool: "lookup",
            arguments: &key,
        },
    ];
    c.bench_function("authorize two lookups, 20 policies", |b| {
        b.iter(|| cedar.authorize(std::hint::black_box(&batch), std::hint::black_box(&lookups)));
    });
}

criterion_group!(benches, authorize);
criterion_main!(benches);
