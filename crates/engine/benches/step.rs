//! The pure engine's cost per turn, with no I/O: one turn of the standard workload is
//! Start/Committed -> Decide, Decided -> Authorize, Authorized -> Execute, two
//! CallFinished -> Commit. Measured at turn 10 and at turn 1,000 of an invocation, to show
//! the cost does not grow with history.
//!
//! `cargo bench -p agentloop-engine --bench step`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::hint::black_box;
use std::sync::Arc;

use agentloop_engine::*;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

fn catalog() -> Arc<ToolCatalog> {
    Arc::new(ToolCatalog::new().with("lookup", ToolSpec::read_only()))
}

fn limits() -> Limits {
    Limits {
        max_steps: 100_000,
        max_tool_calls: 1_000_000,
        max_repeated_plan: None,
        ..Limits::default()
    }
}

fn batch(turn: u32) -> ProposedDecision {
    ProposedDecision::ToolCalls {
        calls: (0..2)
            .map(|i| ProposedCall {
                call_id: format!("t{turn}-c{i}"),
                tool: "lookup".into(),
                arguments_json: format!(r#"{{"key":"k{turn}-{i}"}}"#),
            })
            .collect(),
    }
}

/// Runs one full turn from `Decide` to the commit of the next `Decide`.
fn turn(invocation: &mut Invocation, turn: u32) {
    let now = UnixMillis(0);
    let decided = Input::Decided {
        decision: batch(turn),
        usage: Usage::default(),
    };
    invocation.step(decided, now).unwrap();
    let actions = invocation
        .step(Input::Authorized(Verdict::Allow.into()), now)
        .unwrap();
    let [Action::Execute { calls, .. }] = actions.as_slice() else {
        panic!("expected Execute")
    };
    let ids: Vec<CallId> = calls.iter().map(|c| c.call_id.clone()).collect();
    for id in ids.into_iter().rev() {
        let outcome = CallOutcome::Output {
            output_json: r#"{"value":"v"}"#.into(),
        };
        black_box(
            invocation
                .step(
                    Input::CallFinished {
                        call_id: id,
                        outcome,
                    },
                    now,
                )
                .unwrap(),
        );
    }
    black_box(invocation.step(Input::Committed, now).unwrap());
}

/// An invocation that has committed `turns` turns and waits for the next decision.
fn at_turn(turns: u32) -> Invocation {
    let mut invocation = Invocation::new(limits(), catalog());
    invocation.step(Input::Start, UnixMillis(0)).unwrap();
    for t in 1..=turns {
        turn(&mut invocation, t);
    }
    invocation
}

fn per_turn(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine_turn");
    for history in [10u32, 1_000] {
        let base = at_turn(history);
        group.bench_function(format!("at_turn_{history}"), |b| {
            b.iter_batched(
                || base.clone(),
                |mut inv| turn(&mut inv, history + 1),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, per_turn);
criterion_main!(benches);
