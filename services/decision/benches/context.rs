//! Prompt building costs the same at turn 10 and at turn 1000: the adapter only reads
//! the request's bounded window. Both requests carry the same window (the last 8
//! committed turns, two parallel calls each, plus a summary of the rest), so only the
//! turn number differs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use agentloop_decision::{AdapterDeps, AnthropicModel, MapEnv, ModelConfig, OpenAiModel, Question};
use agentloop_proto::v1::decision::{Kind, ToolCalls};
use agentloop_proto::v1::event::Body;
use agentloop_proto::v1::tool_result::Outcome;
use agentloop_proto::v1::{
    DecideRequest, Decision, Event, ToolCall, ToolDescriptor, ToolOutput, ToolResult,
    TurnCommitted, Usage,
};
use criterion::{Criterion, criterion_group, criterion_main};

const WINDOW: u32 = 8;

fn request(turn: u32) -> DecideRequest {
    let first = turn - WINDOW;
    let history = (first..turn)
        .map(|t| {
            let calls = (0..2)
                .map(|i| ToolCall {
                    call_id: format!("call-{t}-{i}"),
                    tool: "lookup_customer".into(),
                    arguments_json: format!(r#"{{"customer_id":"C-{t}-{i}"}}"#),
                })
                .collect::<Vec<_>>();
            let results = calls
                .iter()
                .map(|c| ToolResult {
                    call_id: c.call_id.clone(),
                    outcome: Some(Outcome::Output(ToolOutput {
                        output_json: format!(
                            r#"{{"id":"{}","name":"Ada","tier":"gold","notes":"{}"}}"#,
                            c.call_id,
                            "x".repeat(400)
                        ),
                        receipt: String::new(),
                    })),
                })
                .collect();
            Event {
                invocation_id: "inv".into(),
                seq: u64::from(t),
                committed_at: None,
                body: Some(Body::Turn(TurnCommitted {
                    turn: t,
                    decision: Some(Decision {
                        kind: Some(Kind::ToolCalls(ToolCalls { calls })),
                    }),
                    results,
                    usage: Some(Usage::default()),
                    rejection: None,
                    plan_digest: String::new(),
                    ..TurnCommitted::default()
                })),
            }
        })
        .collect();
    DecideRequest {
        invocation_id: "inv".into(),
        turn,
        goal: "Find the customer's tier and the refund policy.".into(),
        profile: "default".into(),
        tools: vec![ToolDescriptor {
            name: "lookup_customer".into(),
            description: "Looks a customer up".into(),
            input_schema_json: r#"{"type":"object","properties":{"customer_id":{"type":"string"}},"required":["customer_id"]}"#.into(),
            ..ToolDescriptor::default()
        }],
        history,
        context_from_seq: u64::from(first),
        summary: if first > 1 { format!("{} earlier turns", first - 1) } else { String::new() },
        scripted_model_json: String::new(),
        history_left_out: 0,
        tools_left_out: false,
    }
}

/// Builds and serialises one adapter's request body: the work of a turn's prompt.
type BodyOf<'a> = dyn Fn(&DecideRequest) -> Vec<u8> + 'a;

fn bench(c: &mut Criterion) {
    let env = MapEnv::new([("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")]);
    let openai = openai_model(&env);
    let anthropic = AnthropicModel::from_config(
        &ModelConfig::from_spec("anthropic:bench").unwrap(),
        &env,
        &AdapterDeps::default(),
    )
    .unwrap();
    let adapters: [(&str, &BodyOf); 2] = [
        ("openai", &|r| {
            serde_json::to_vec(&openai.request_body(&Question::from(r), &r.tools)).unwrap()
        }),
        ("anthropic", &|r| {
            serde_json::to_vec(&anthropic.request_body(&Question::from(r), &r.tools)).unwrap()
        }),
    ];
    let mut group = c.benchmark_group("context");
    // Each adapter's two turns run back to back, so a change in the load of a shared
    // machine between them skews the comparison as little as it can.
    for (name, body) in adapters {
        for turn in [10u32, 1000] {
            let request = request(turn);
            assert_eq!(request.history.len(), WINDOW as usize);
            // The same work in bytes: only the digits of turn numbers and IDs differ.
            eprintln!("{name} turn {turn}: {} bytes", body(&request).len());
            group.bench_function(format!("{name}_prompt_turn_{turn}"), |b| {
                b.iter(|| body(black_box(&request)));
            });
        }
    }
    group.finish();
}

fn openai_model(env: &MapEnv) -> OpenAiModel {
    OpenAiModel::from_config(
        &ModelConfig::from_spec("openai:bench").unwrap(),
        env,
        &AdapterDeps::default(),
    )
    .unwrap()
}

criterion_group!(benches, bench);
criterion_main!(benches);
