//! Invariants that must hold whatever the model proposes and in whatever order tools answer.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::num::NonZeroU32;

use agentloop_engine::*;
use agentloop_testkit::*;
use proptest::prelude::*;

fn arb_outcome() -> impl Strategy<Value = CallOutcome> {
    prop_oneof![
        "[a-z]{0,6}".prop_map(|v| output(&format!(r#"{{"v":"{v}"}}"#))),
        Just(CallOutcome::Cancelled),
        Just(CallOutcome::NotStarted),
        "[a-z ]{0,12}".prop_map(|detail| CallOutcome::Unknown { detail }),
        any::<bool>().prop_map(|retryable| CallOutcome::Error(ToolError {
            error_type: ErrorType::Timeout,
            message: "slow".into(),
            retryable,
            next_allowed_action: NextAction::Retry,
        })),
    ]
}

/// A batch of `n` read-only calls, their outcomes, and an arrival order.
fn arb_batch() -> impl Strategy<Value = (Vec<ProposedCall>, Vec<CallOutcome>, Vec<usize>)> {
    (1usize..=12).prop_flat_map(|n| {
        let calls: Vec<ProposedCall> = (0..n)
            .map(|i| lookup(&format!("call-{i}"), &format!("k{i}")))
            .collect();
        let order = Just((0..n).collect::<Vec<usize>>()).prop_shuffle();
        (
            Just(calls),
            proptest::collection::vec(arb_outcome(), n),
            order,
        )
    })
}

proptest! {
    /// Whatever the arrival order, with stray and duplicate results thrown in, each call is
    /// committed with its own outcome, in call order, exactly once.
    #[test]
    fn correlation_never_pairs_a_result_with_the_wrong_call(
        (calls, outcomes, order) in arb_batch(),
        strays in proptest::collection::vec(any::<bool>(), 12),
    ) {
        let mut invocation = Invocation::new(Limits::default(), catalog());
        invocation.step(Input::Start, UnixMillis(0)).unwrap();
        invocation.step(Input::Decided { decision: tools(calls.clone()), usage: Usage::default() }, UnixMillis(0)).unwrap();
        invocation.step(Input::Authorized(Verdict::Allow.into()), UnixMillis(0)).unwrap();
        let mut committed = None;
        for (step, &index) in order.iter().enumerate() {
            if strays[step] {
                let stray = Input::CallFinished { call_id: CallId::new("not-in-batch"), outcome: CallOutcome::Cancelled };
                prop_assert_eq!(invocation.step(stray, UnixMillis(0)), Err(StepError::UnknownCall(CallId::new("not-in-batch"))));
            }
            let call_id = CallId::new(calls[index].call_id.clone());
            let actions = invocation.step(Input::CallFinished { call_id: call_id.clone(), outcome: outcomes[index].clone() }, UnixMillis(0)).unwrap();
            if step + 1 < order.len() {
                prop_assert!(actions.is_empty(), "nothing is committed before every call has its result");
                let again = invocation.step(Input::CallFinished { call_id: call_id.clone(), outcome: CallOutcome::Cancelled }, UnixMillis(0));
                prop_assert_eq!(again, Err(StepError::DuplicateResult(call_id)));
            } else {
                committed = Some(actions);
            }
        }
        let actions = committed.unwrap();
        let [Action::Commit { events, .. }] = actions.as_slice() else { panic!("expected a commit, got {actions:?}") };
        let EventBody::Turn(turn) = &events[0].body else { panic!("expected a turn") };
        prop_assert_eq!(turn.results.len(), calls.len());
        for ((result, call), outcome) in turn.results.iter().zip(&calls).zip(&outcomes) {
            prop_assert_eq!(result.call_id.as_str(), call.call_id.as_str());
            prop_assert_eq!(&result.outcome, outcome);
        }
    }
}

/// One scripted decision, drawn from a small vocabulary so that repeats are common.
fn arb_decision() -> impl Strategy<Value = (ProposedDecision, Usage)> {
    let batch = proptest::collection::vec(0u8..3, 1..4).prop_map(|keys| {
        tools(
            keys.iter()
                .enumerate()
                .map(|(i, k)| lookup(&format!("c{i}"), &format!("key{k}")))
                .collect(),
        )
    });
    // A batch with a write is committed as started before it runs: a resume can land
    // between the start and the turn.
    let with_write = (0u8..3, 1u32..1_000).prop_map(|(k, amount)| {
        tools(vec![
            lookup("c0", &format!("key{k}")),
            call(
                "w",
                "transfer",
                &format!(r#"{{"to":"acct-{k}","amount":{amount}}}"#),
            ),
        ])
    });
    let decision = prop_oneof![
        4 => batch,
        2 => with_write,
        1 => Just(final_answer("done")),
        1 => Just(tools(vec![call("x", "no_such_tool", "{}")])),
    ];
    // Mostly priced decisions; now and then one from a model with no price.
    let cost = proptest::option::weighted(0.9, 0u64..50).prop_map(|c| c.map(MicroUsd));
    (decision, 0u64..60, 0u64..20, cost).prop_map(|(d, i, o, cost)| {
        (
            d,
            Usage {
                input_tokens: i,
                output_tokens: o,
                cost,
            },
        )
    })
}

fn arb_limits() -> impl Strategy<Value = Limits> {
    (
        1u32..10,
        0u32..12,
        proptest::option::of(0u64..400),
        proptest::option::of(0u64..200),
        proptest::option::of(1u32..4),
        0u32..2,
    )
        .prop_map(
            |(max_steps, max_tool_calls, max_tokens, max_cost, repeat, decision_repairs)| Limits {
                max_steps,
                max_tool_calls,
                max_tokens,
                max_cost: max_cost.map(MicroUsd),
                max_repeated_plan: repeat.and_then(NonZeroU32::new),
                decision_repairs,
                ..Limits::default()
            },
        )
}

fn world(script: &[(ProposedDecision, Usage)], repeat_last: bool) -> World {
    let mut world = World::scripted(vec![]);
    world.script = script.iter().cloned().map(Ok).collect();
    world.repeat_last = repeat_last;
    world
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// No budget is exceeded by anything the engine acts on.
    #[test]
    fn no_budget_is_ever_exceeded(
        limits in arb_limits(),
        script in proptest::collection::vec(arb_decision(), 1..12),
        repeat_last in any::<bool>(),
    ) {
        let run = drive(Invocation::new(limits, catalog()), world(&script, repeat_last));
        let totals = run.outcome.totals;
        prop_assert!(totals.steps <= limits.max_steps);
        prop_assert!(totals.tool_calls <= limits.max_tool_calls);
        prop_assert_eq!(run.executed.len() as u32, totals.tool_calls);
        let decides = run.actions.iter().filter(|a| matches!(a, Action::Decide { .. })).count();
        prop_assert!(decides as u32 <= limits.max_steps);
        if let Some(max) = limits.max_tokens {
            // Every executed batch and accepted answer was decided within the token budget.
            let mut used = 0u64;
            for turn in turns(&run.log) {
                used += turn.usage.total();
                if turn.rejection.is_none() {
                    prop_assert!(used <= max, "turn {} acted on at {used} tokens of {max}", turn.turn);
                }
            }
        }
        if let Some(max) = limits.max_cost {
            // Every executed batch and accepted answer was decided within the cost
            // budget, and had a cost: an unpriced decision never counts as free.
            let mut spent = MicroUsd::ZERO;
            for turn in turns(&run.log) {
                spent = spent.saturating_add(turn.usage.cost.unwrap_or_default());
                if turn.rejection.is_none() {
                    prop_assert!(turn.usage.cost.is_some(), "turn {} acted on without a cost", turn.turn);
                    prop_assert!(spent <= max, "turn {} acted on at {spent} of {max}", turn.turn);
                }
            }
            prop_assert_eq!(totals.cost, spent);
        }
    }

    /// However the model repeats itself, no plan executes more often in a row than allowed.
    #[test]
    fn a_repeated_plan_never_executes_more_often_than_the_limit(
        limit in 1u32..4,
        script in proptest::collection::vec(arb_decision(), 1..12),
        repeat_last in any::<bool>(),
    ) {
        let limits = Limits { max_steps: 30, max_tool_calls: 1000, max_repeated_plan: NonZeroU32::new(limit), ..Limits::default() };
        let run = drive(Invocation::new(limits, catalog()), world(&script, repeat_last));
        let mut streak: Option<(Fingerprint, u32)> = None;
        for turn in turns(&run.log).into_iter().filter(|t| !t.results.is_empty()) {
            let plan = turn.plan.unwrap();
            streak = Some(match streak {
                Some((last, n)) if last == plan => (plan, n + 1),
                _ => (plan, 1),
            });
            prop_assert!(streak.unwrap().1 <= limit);
        }
    }

    /// Restoring from the committed log gives the live state; resuming from any commit
    /// boundary after a crash ends exactly as the uninterrupted run did.
    #[test]
    fn a_resume_from_any_commit_boundary_ends_the_same(
        limits in arb_limits(),
        script in proptest::collection::vec(arb_decision(), 1..10),
    ) {
        let whole = drive(Invocation::new(limits, catalog()), world(&script, false));
        let restored = Invocation::restore(limits, catalog(), &whole.log).unwrap();
        prop_assert_eq!(restored.protocol(), whole.invocation.protocol());
        prop_assert_eq!(restored.outcome(), Some(&whole.outcome));

        let mut boundary = 0usize;
        for action in &whole.actions {
            let Action::Commit { events, .. } = action else { continue };
            let prefix = &whole.log[..boundary];
            let resumed = Invocation::restore(limits, catalog(), prefix).unwrap();
            let rest = drive_from(resumed, world(&script, false), prefix.to_vec());
            prop_assert_eq!(&rest.log, &whole.log);
            prop_assert_eq!(&rest.outcome, &whole.outcome);
            boundary += events.len();
        }
    }
}

/// Decisions of an approval run: lookups, requests to approve a write, writes a policy
/// gates, questions for the user and the answer.
fn arb_human_decision() -> impl Strategy<Value = (ProposedDecision, Usage)> {
    let write = |k: u8| {
        vec![call(
            "w",
            "transfer",
            &format!(r#"{{"to":"acct-{k}","amount":10}}"#),
        )]
    };
    let decision = prop_oneof![
        2 => (0u8..3).prop_map(|k| tools(vec![lookup("c0", &format!("key{k}"))])),
        3 => (0u8..2).prop_map(move |k| ProposedDecision::RequestApproval {
            summary: format!("pay acct-{k}"),
            calls: write(k),
        }),
        2 => (0u8..2).prop_map(move |k| tools(write(k))),
        1 => Just(ProposedDecision::Clarification { question: "which?".into() }),
        1 => Just(final_answer("done")),
    ];
    (decision, 0u64..30).prop_map(|(d, i)| {
        (
            d,
            Usage {
                input_tokens: i,
                output_tokens: 1,
                cost: None,
            },
        )
    })
}

fn is_reply(event: &Event) -> bool {
    matches!(
        event.body,
        EventBody::ApprovalResolved(_) | EventBody::ClarificationAnswered(_)
    )
}

fn gated_world(script: &[(ProposedDecision, Usage)]) -> World {
    let mut world = world(script, false);
    // Writes need a human; an approval of exactly those calls satisfies the gate.
    world.policy = Box::new(|calls| {
        if calls.iter().any(|c| c.tool == "transfer") {
            Verdict::RequireApproval {
                reason: "writes need a human".into(),
            }
        } else {
            Verdict::Allow
        }
    });
    world
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// An approval run (every wait answered by a human, yes or no) resumed from any
    /// commit boundary, including right after a reply, ends exactly as the run that was
    /// never interrupted; and an approved write runs once per approval, never twice.
    #[test]
    fn an_approval_run_resumed_from_any_commit_boundary_ends_the_same(
        limits in arb_limits(),
        script in proptest::collection::vec(arb_human_decision(), 1..8),
        humans in proptest::collection::vec(any::<bool>(), 0..6),
    ) {
        let whole = drive_with_humans(limits, catalog(), gated_world(&script), Vec::new(), &humans);
        let restored = Invocation::restore(limits, catalog(), &whole.log).unwrap();
        prop_assert_eq!(restored.protocol(), whole.invocation.protocol());
        prop_assert_eq!(restored.outcome(), Some(&whole.outcome));

        let approvals = whole
            .log
            .iter()
            .filter(|e| matches!(&e.body, EventBody::ApprovalResolved(r) if r.approved))
            .count();
        let writes = whole.executed.iter().filter(|c| c.tool == "transfer").count();
        prop_assert!(writes <= approvals, "{writes} writes ran with {approvals} approvals");

        // Commit boundaries: where each engine commit began, and around each reply (its
        // own append), and the end.
        let mut boundaries: std::collections::BTreeSet<usize> = whole
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Commit { expected_version, .. } => Some(*expected_version as usize),
                _ => None,
            })
            .collect();
        for event in &whole.log {
            if is_reply(event) {
                boundaries.extend([event.seq as usize - 1, event.seq as usize]);
            }
        }
        boundaries.insert(whole.log.len());
        for boundary in boundaries {
            let prefix = whole.log[..boundary].to_vec();
            let replied = prefix.iter().filter(|e| is_reply(e)).count();
            let left = &humans[replied.min(humans.len())..];
            let rest = drive_with_humans(limits, catalog(), gated_world(&script), prefix, left);
            prop_assert_eq!(&rest.log, &whole.log);
            prop_assert_eq!(&rest.outcome, &whole.outcome);
        }
    }
}

#[test]
fn restore_refuses_a_broken_history() {
    let run = drive(
        Invocation::new(Limits::default(), catalog()),
        World::scripted(vec![tools(vec![lookup("a", "profile")]), final_answer("x")]),
    );
    let mut gap = run.log.clone();
    gap.remove(0);
    assert_eq!(
        Invocation::restore(Limits::default(), catalog(), &gap).unwrap_err(),
        RestoreError::SeqGap {
            expected: 1,
            found: 2
        }
    );
    let mut after_end = run.log.clone();
    let extra = Event {
        seq: 4,
        body: after_end[0].body.clone(),
    };
    after_end.push(extra);
    assert_eq!(
        Invocation::restore(Limits::default(), catalog(), &after_end).unwrap_err(),
        RestoreError::AfterEnd(4)
    );
    let mut no_plan = run.log.clone();
    if let EventBody::Turn(turn) = &mut no_plan[0].body {
        turn.plan = None;
    }
    assert_eq!(
        Invocation::restore(Limits::default(), catalog(), &no_plan).unwrap_err(),
        RestoreError::MissingPlan(1)
    );
}
