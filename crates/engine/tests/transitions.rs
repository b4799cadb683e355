//! Every transition and every terminal reason, driven through the public API.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::num::NonZeroU32;

use agentloop_engine::*;
use agentloop_testkit::*;

/// A cancel without a reason.
fn cancel() -> Input {
    Input::Cancel {
        reason: String::new(),
    }
}

fn limits() -> Limits {
    Limits {
        max_repeated_plan: NonZeroU32::new(1),
        ..Limits::default()
    }
}

fn run(decisions: Vec<ProposedDecision>) -> Run {
    drive(
        Invocation::new(limits(), catalog()),
        World::scripted(decisions),
    )
}

fn ended(run: &Run) -> &EndRecord {
    match &run.log.last().expect("a log").body {
        EventBody::Ended(end) => end,
        other => panic!("the log does not end with Ended: {other:?}"),
    }
}

#[test]
fn the_demos_two_step_parallel_lookup_completes() {
    let run = run(vec![
        tools(vec![
            lookup("call-profile", "profile"),
            lookup("call-policy", "policy"),
        ]),
        final_answer("profile=active; policy=refund-under-100"),
    ]);
    assert_eq!(run.outcome.reason, TerminalReason::Completed);
    assert_eq!(
        run.outcome.answer.as_deref(),
        Some("profile=active; policy=refund-under-100")
    );
    let totals = run.outcome.totals;
    assert_eq!(
        (totals.steps, totals.tool_calls, totals.turn_events),
        (2, 2, 2)
    );
    // The tools answered in reverse order; the log keeps call order.
    assert_eq!(run.executed[0].call_id.as_str(), "call-policy");
    let first = turns(&run.log)[0];
    let ids: Vec<&str> = first.results.iter().map(|r| r.call_id.as_str()).collect();
    assert_eq!(ids, ["call-profile", "call-policy"]);
    assert_eq!(
        first.results[0].outcome,
        output(r#"{"key":"profile","value":"active"}"#)
    );
    // Both lookups ran in one parallel stage.
    let plan = run.actions.iter().find_map(|a| match a {
        Action::Execute { plan, .. } => Some(plan.clone()),
        _ => None,
    });
    assert_eq!(
        plan,
        Some(ExecutionPlan {
            stages: vec![vec![0, 1]]
        })
    );
}

#[test]
fn each_turn_is_committed_before_the_next_decision() {
    let run = run(vec![
        tools(vec![lookup("a", "profile")]),
        tools(vec![lookup("b", "policy")]),
        final_answer("done"),
    ]);
    let mut committed_turns = 0;
    for action in &run.actions {
        match action {
            Action::Decide { turn } => assert_eq!(
                *turn,
                committed_turns + 1,
                "turn {turn} decided before turn {} was committed",
                turn - 1
            ),
            Action::Commit { events, .. } => {
                committed_turns += u32::try_from(
                    events
                        .iter()
                        .filter(|e| matches!(e.body, EventBody::Turn(_)))
                        .count(),
                )
                .unwrap();
            }
            _ => {}
        }
    }
    assert_eq!(run.outcome.totals.steps, 3);
}

#[test]
fn identical_plan_stops_with_no_progress_before_its_second_execution() {
    let mut world = World::scripted(vec![tools(vec![call(
        "same-call",
        "lookup",
        r#"{"key":"same"}"#,
    )])]);
    world.repeat_last = true;
    let run = drive(Invocation::new(limits(), catalog()), world);
    assert_eq!(run.outcome.reason, TerminalReason::NoProgress);
    assert_eq!(
        run.executed.len(),
        1,
        "the repeated plan must not execute a second time"
    );
    assert_eq!(run.outcome.totals.tool_calls, 1);
    // The refused decision is on record, marked as not carried out.
    let last = turns(&run.log)[1];
    assert_eq!(
        last.rejection.as_ref().map(|r| r.kind),
        Some(RejectionKind::Stopped)
    );
    assert!(last.results.is_empty());
}

#[test]
fn reordered_keys_and_calls_are_the_same_plan() {
    let run = run(vec![
        tools(vec![
            call("a", "lookup", r#"{"key":"x","v":1}"#),
            call("b", "lookup", r#"{"key":"y"}"#),
        ]),
        tools(vec![
            call("c", "lookup", r#"{"key":"y"}"#),
            call("d", "lookup", r#"{ "v":1, "key":"x" }"#),
        ]),
    ]);
    assert_eq!(run.outcome.reason, TerminalReason::NoProgress);
    assert_eq!(run.executed.len(), 2);
}

#[test]
fn a_tool_repeated_forever_without_repeat_detection_ends_at_max_steps() {
    let mut world = World::scripted(vec![tools(vec![lookup("again", "profile")])]);
    world.repeat_last = true;
    let limits = Limits {
        max_steps: 5,
        max_repeated_plan: None,
        ..Limits::default()
    };
    let run = drive(Invocation::new(limits, catalog()), world);
    assert_eq!(run.outcome.reason, TerminalReason::MaxSteps);
    assert_eq!(run.outcome.totals.steps, 5);
    assert_eq!(run.executed.len(), 5);
    assert_eq!(
        run.actions
            .iter()
            .filter(|a| matches!(a, Action::Decide { .. }))
            .count(),
        5
    );
}

#[test]
fn partial_failure_keeps_each_calls_result() {
    let run = run(vec![
        tools(vec![
            lookup("a", "profile"),
            lookup("b", "missing"),
            lookup("c", "policy"),
        ]),
        final_answer("two of three"),
    ]);
    assert_eq!(run.outcome.reason, TerminalReason::Completed);
    let results = &turns(&run.log)[0].results;
    assert!(matches!(results[0].outcome, CallOutcome::Output { .. }));
    assert!(
        matches!(&results[1].outcome, CallOutcome::Error(e) if e.error_type == ErrorType::NotFound && !e.retryable)
    );
    assert!(matches!(results[2].outcome, CallOutcome::Output { .. }));
}

#[test]
fn invalid_decisions_end_with_the_reason_and_execute_nothing() {
    let cases = [
        (tools(vec![]), "empty"),
        (tools(vec![call("", "lookup", "{}")]), "no call ID"),
        (
            tools(vec![lookup("a", "x"), lookup("a", "y")]),
            "used twice",
        ),
        (tools(vec![call("a", "rm_rf", "{}")]), "unknown tool"),
        (tools(vec![call("a", "lookup", "{nope")]), "not JSON"),
        (
            ProposedDecision::Unparseable {
                text: "I think I'll call lookup".into(),
            },
            "not a decision",
        ),
        (final_answer("  "), "answer is empty"),
    ];
    for (decision, needle) in cases {
        let run = run(vec![decision.clone()]);
        assert_eq!(
            run.outcome.reason,
            TerminalReason::InvalidDecision,
            "{decision:?}"
        );
        assert!(
            run.outcome.detail.contains(needle),
            "{:?} lacks {needle:?}",
            run.outcome.detail
        );
        assert!(run.executed.is_empty());
        let turn = turns(&run.log)[0];
        assert_eq!(
            turn.decision, decision,
            "the rejected proposal is recorded verbatim"
        );
        assert_eq!(
            turn.rejection.as_ref().map(|r| r.kind),
            Some(RejectionKind::InvalidDecision)
        );
    }
}

#[test]
fn an_invalid_decision_gets_one_repair_turn_when_configured() {
    let limits = Limits {
        decision_repairs: 1,
        ..limits()
    };
    let repaired = drive(
        Invocation::new(limits, catalog()),
        World::scripted(vec![
            tools(vec![call("a", "nope", "{}")]),
            final_answer("fixed"),
        ]),
    );
    assert_eq!(repaired.outcome.reason, TerminalReason::Completed);
    assert_eq!(repaired.outcome.totals.steps, 2);
    assert_eq!(repaired.invocation.protocol().decision_repairs_used, 1);

    let twice = drive(
        Invocation::new(limits, catalog()),
        World::scripted(vec![tools(vec![call("a", "nope", "{}")]), tools(vec![])]),
    );
    assert_eq!(twice.outcome.reason, TerminalReason::InvalidDecision);
    assert!(twice.outcome.detail.contains("empty"));
}

#[test]
fn policy_denial_is_an_invalid_decision_and_nothing_runs() {
    let mut world = World::scripted(vec![tools(vec![lookup("a", "profile")])]);
    world.policy = Box::new(|_| Verdict::Deny {
        reason: "key: must be one of profile, policy".into(),
        refusals: Vec::new(),
    });
    let run = drive(Invocation::new(limits(), catalog()), world);
    assert_eq!(run.outcome.reason, TerminalReason::InvalidDecision);
    assert!(run.outcome.detail.starts_with("denied by policy: key"));
    assert!(run.executed.is_empty());
}

#[test]
fn approval_required_from_the_model_or_from_policy_is_bound_to_the_plan() {
    let calls = vec![call("t1", "transfer", r#"{"to":"acct-1","amount":40}"#)];
    let from_model = run(vec![ProposedDecision::RequestApproval {
        summary: "refund 40".into(),
        calls: calls.clone(),
    }]);
    assert_eq!(from_model.outcome.reason, TerminalReason::ApprovalRequired);
    assert_eq!(from_model.outcome.detail, "refund 40");

    let mut world = World::scripted(vec![tools(calls.clone())]);
    world.policy = Box::new(|_| Verdict::RequireApproval {
        reason: "transfers need a human".into(),
    });
    let from_policy = drive(Invocation::new(limits(), catalog()), world);
    assert_eq!(from_policy.outcome.reason, TerminalReason::ApprovalRequired);
    assert!(from_policy.executed.is_empty());

    let expected = validate(&tools(calls), &catalog(), &DecisionBounds::default()).unwrap();
    let Decision::ToolCalls(batch) = expected else {
        panic!()
    };
    assert_eq!(ended(&from_model).proposal, Some(batch.fingerprint));
    assert_eq!(ended(&from_policy).proposal, Some(batch.fingerprint));
}

#[test]
fn clarification_and_cannot_continue_end_with_the_models_text() {
    let run_q = run(vec![ProposedDecision::Clarification {
        question: "Which account?".into(),
    }]);
    assert_eq!(run_q.outcome.reason, TerminalReason::ClarificationRequired);
    assert_eq!(run_q.outcome.detail, "Which account?");
    let run_c = run(vec![ProposedDecision::CannotContinue {
        reason: "no access to billing".into(),
    }]);
    assert_eq!(run_c.outcome.reason, TerminalReason::CannotContinue);
    assert_eq!(run_c.outcome.detail, "no access to billing");
    assert_eq!(run_c.outcome.totals.steps, 1);
}

#[test]
fn a_failing_model_ends_with_model_error() {
    let mut world = World::scripted(vec![tools(vec![lookup("a", "profile")])]);
    world.script.push(Err("HTTP 503 after 4 attempts".into()));
    let run = drive(Invocation::new(limits(), catalog()), world);
    assert_eq!(run.outcome.reason, TerminalReason::ModelError);
    assert_eq!(run.outcome.detail, "HTTP 503 after 4 attempts");
    assert_eq!(run.outcome.totals.steps, 1);
}

#[test]
fn verification_gets_one_repair_turn_then_fails() {
    let mut world = World::scripted(vec![final_answer("guess"), final_answer("evidence-backed")]);
    world.verify = Box::new(|answer, _| {
        if answer == "guess" {
            Verification::Rejected {
                reason: "no evidence".into(),
                checks: Vec::new(),
            }
        } else {
            Verification::Accepted { checks: Vec::new() }
        }
    });
    let repaired = drive(Invocation::new(limits(), catalog()), world);
    assert_eq!(repaired.outcome.reason, TerminalReason::Completed);
    assert_eq!(repaired.outcome.answer.as_deref(), Some("evidence-backed"));
    assert_eq!(
        turns(&repaired.log)[0]
            .rejection
            .as_ref()
            .map(|r| r.message.as_str()),
        Some("no evidence")
    );

    let mut world = World::scripted(vec![final_answer("guess")]);
    world.repeat_last = true;
    world.verify = Box::new(|_, _| Verification::Rejected {
        reason: "no evidence".into(),
        checks: Vec::new(),
    });
    let failed = drive(Invocation::new(limits(), catalog()), world);
    assert_eq!(failed.outcome.reason, TerminalReason::VerificationFailed);
    assert_eq!(failed.outcome.totals.steps, 2);
    assert_eq!(
        failed.outcome.answer, None,
        "a rejected answer is never reported as the answer"
    );
}

fn check(name: &str, verdict: CheckVerdict, evidence: &[&str]) -> Check {
    Check {
        name: name.into(),
        kind: CheckKind::Rule,
        verdict,
        reasons: Vec::new(),
        evidence: evidence.iter().map(|e| (*e).to_owned()).collect(),
    }
}

fn citing(answer: &str, evidence: &[&str]) -> ProposedDecision {
    ProposedDecision::Final {
        answer: answer.into(),
        evidence: evidence.iter().map(|e| (*e).to_owned()).collect(),
    }
}

#[test]
fn the_citations_go_to_verification_and_its_checks_are_committed() {
    let mut world = World::scripted(vec![
        tools(vec![lookup("a", "profile")]),
        citing("guess", &[]),
        // Cited twice: once is enough.
        citing("profile=active", &["a", "a"]),
    ]);
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = asked.clone();
    world.verify = Box::new(move |answer, evidence| {
        seen.lock().unwrap().push(evidence.to_vec());
        if evidence.is_empty() {
            Verification::Rejected {
                reason: "citations: cite something".into(),
                checks: vec![check("citations", CheckVerdict::Rejected, &[])],
            }
        } else {
            assert_eq!(answer, "profile=active");
            Verification::Accepted {
                checks: vec![check("citations", CheckVerdict::Accepted, &["a"])],
            }
        }
    });
    let run = drive(Invocation::new(limits(), catalog()), world);
    assert_eq!(run.outcome.reason, TerminalReason::Completed);
    assert_eq!(*asked.lock().unwrap(), vec![vec![], vec![CallId::new("a")]]);
    let turns = turns(&run.log);
    assert_eq!(
        turns[1].checks[0].verdict,
        CheckVerdict::Rejected,
        "the rejected answer's checks are in its turn"
    );
    let end = ended(&run);
    assert_eq!(
        end.accepted_by[0].evidence,
        vec!["a"],
        "the end says what accepted the answer"
    );
    assert!(
        turns[2].checks.is_empty(),
        "once: with the end, not the turn too"
    );
    assert!(!run.invocation.protocol().wrote, "only lookups ran");

    // The log restores to the same state, checks and all.
    let restored = Invocation::restore(limits(), catalog(), &run.log).unwrap();
    assert_eq!(restored.protocol(), run.invocation.protocol());
}

#[test]
fn citations_beyond_their_bounds_are_an_invalid_decision() {
    let long = "x".repeat(DecisionBounds::default().max_call_id_bytes + 1);
    let many: Vec<String> = (0..=DecisionBounds::default().max_evidence)
        .map(|i| format!("c{i}"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    for (evidence, why) in [
        (vec![long.as_str()], "is not a call ID"),
        (vec![" "], "is not a call ID"),
        (many, "at most 64"),
    ] {
        let mut world = World::scripted(vec![citing("42", &evidence)]);
        world.repeat_last = true;
        let run = drive(Invocation::new(limits(), catalog()), world);
        assert_eq!(run.outcome.reason, TerminalReason::InvalidDecision);
        assert!(run.outcome.detail.contains(why), "{}", run.outcome.detail);
    }
}

#[test]
fn tool_budget_refuses_the_batch_that_would_exceed_it() {
    let limits = Limits {
        max_tool_calls: 3,
        ..limits()
    };
    let run = drive(
        Invocation::new(limits, catalog()),
        World::scripted(vec![
            tools(vec![lookup("a", "profile"), lookup("b", "policy")]),
            tools(vec![lookup("c", "x"), lookup("d", "y")]),
        ]),
    );
    assert_eq!(run.outcome.reason, TerminalReason::ToolBudgetExhausted);
    assert_eq!(run.outcome.totals.tool_calls, 2);
    assert_eq!(run.executed.len(), 2);
}

#[test]
fn token_budget_stops_the_decision_that_crosses_it_and_the_turn_after_it_is_reached() {
    let limits = Limits {
        max_tokens: Some(100),
        ..limits()
    };
    let usage = |n| Usage {
        input_tokens: n,
        output_tokens: 10,
        ..Usage::default()
    };
    let mut world = World::scripted(vec![]);
    world.script = vec![
        Ok((tools(vec![lookup("a", "profile")]), usage(50))),
        Ok((tools(vec![lookup("b", "policy")]), usage(50))),
    ];
    let crossed = drive(Invocation::new(limits, catalog()), world);
    assert_eq!(crossed.outcome.reason, TerminalReason::TokenBudgetExhausted);
    assert_eq!(
        crossed.executed.len(),
        1,
        "the decision that crossed the budget is not carried out"
    );
    assert_eq!(
        crossed.outcome.totals.input_tokens + crossed.outcome.totals.output_tokens,
        120
    );

    let mut world = World::scripted(vec![]);
    world.script = vec![Ok((tools(vec![lookup("a", "profile")]), usage(90)))];
    let reached = drive(Invocation::new(limits, catalog()), world);
    assert_eq!(reached.outcome.reason, TerminalReason::TokenBudgetExhausted);
    assert_eq!(
        reached
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Decide { .. }))
            .count(),
        1
    );
}

/// Usage of a decision that cost `micros` micro-dollars (`None`: an unpriced model).
fn costing(micros: Option<u64>) -> Usage {
    Usage {
        input_tokens: 100,
        output_tokens: 10,
        cost: micros.map(MicroUsd),
    }
}

fn with_costs(limits: Limits, script: Vec<(ProposedDecision, Usage)>) -> Run {
    let mut world = World::scripted(vec![]);
    world.script = script.into_iter().map(Ok).collect();
    drive(Invocation::new(limits, catalog()), world)
}

#[test]
fn cost_budget_stops_the_decision_that_crosses_it_as_token_budget_exhausted() {
    let limits = Limits {
        max_cost: Some(MicroUsd(100_000)),
        ..limits()
    };
    let run = with_costs(
        limits,
        vec![
            (tools(vec![lookup("a", "profile")]), costing(Some(60_000))),
            (tools(vec![lookup("b", "policy")]), costing(Some(60_000))),
        ],
    );
    assert_eq!(run.outcome.reason, TerminalReason::TokenBudgetExhausted);
    assert_eq!(
        run.outcome.detail,
        "the cost budget is spent: this decision brings the cost to $0.12, the cost budget is $0.10"
    );
    assert_eq!(
        run.executed.len(),
        1,
        "the decision that crossed the budget is not carried out"
    );
    // Each turn event carries its cost, and the totals are their sum (what was spent,
    // including the refused decision: it was paid for).
    let costs: Vec<Option<MicroUsd>> = turns(&run.log).iter().map(|t| t.usage.cost).collect();
    assert_eq!(costs, [Some(MicroUsd(60_000)), Some(MicroUsd(60_000))]);
    assert_eq!(
        turns(&run.log)[1].rejection.as_ref().map(|r| r.kind),
        Some(RejectionKind::Stopped)
    );
    assert_eq!(run.outcome.totals.cost, MicroUsd(120_000));
    let restored = Invocation::restore(limits, catalog(), &run.log).unwrap();
    assert_eq!(restored.protocol().totals.cost, MicroUsd(120_000));
}

#[test]
fn a_spent_cost_budget_asks_the_model_no_more() {
    let limits = Limits {
        max_cost: Some(MicroUsd(100_000)),
        ..limits()
    };
    // Exactly the budget: the turn is carried out, and no further turn is decided.
    let run = with_costs(
        limits,
        vec![
            (tools(vec![lookup("a", "profile")]), costing(Some(100_000))),
            (final_answer("never asked"), costing(Some(0))),
        ],
    );
    assert_eq!(run.outcome.reason, TerminalReason::TokenBudgetExhausted);
    assert_eq!(
        run.outcome.detail,
        "the cost budget is spent: $0.10 used, the cost budget is $0.10"
    );
    assert_eq!(run.executed.len(), 1);
    let decides = run
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Decide { .. }))
        .count();
    assert_eq!(decides, 1);
}

#[test]
fn an_unpriced_decision_under_a_cost_budget_is_a_model_error_and_runs_nothing() {
    let limits = Limits {
        max_cost: Some(MicroUsd(1_000_000)),
        ..limits()
    };
    let run = with_costs(
        limits,
        vec![(tools(vec![lookup("a", "profile")]), costing(None))],
    );
    assert_eq!(run.outcome.reason, TerminalReason::ModelError);
    assert!(
        run.outcome.detail.contains("no cost") && run.outcome.detail.contains("cost budget"),
        "{}",
        run.outcome.detail
    );
    assert!(run.executed.is_empty());
    // The decision is still recorded (its tokens were used), as stopped.
    let turn = turns(&run.log)[0];
    assert_eq!(turn.usage, costing(None));
    assert_eq!(
        turn.rejection.as_ref().map(|r| r.kind),
        Some(RejectionKind::Stopped)
    );
}

#[test]
fn without_a_cost_budget_unpriced_decisions_run_and_priced_ones_are_summed() {
    let run = with_costs(
        limits(),
        vec![
            (tools(vec![lookup("a", "profile")]), costing(Some(250))),
            (tools(vec![lookup("b", "policy")]), costing(None)),
            (final_answer("done"), costing(Some(1))),
        ],
    );
    assert_eq!(run.outcome.reason, TerminalReason::Completed);
    assert_eq!(run.outcome.totals.cost, MicroUsd(251));
    let first_commit = run.actions.iter().find_map(|a| match a {
        Action::Commit { totals, .. } => Some(totals.cost),
        _ => None,
    });
    assert_eq!(
        first_commit,
        Some(MicroUsd(250)),
        "the first commit's totals"
    );
}

#[test]
fn histories_and_totals_recorded_before_costs_existed_still_load() {
    let turn: TurnRecord = serde_json::from_str(
        r#"{"turn":1,"decision":{"final":{"answer":"x"}},"usage":{"input_tokens":5,"output_tokens":1}}"#,
    )
    .unwrap();
    assert_eq!(turn.usage.cost, None);
    let totals: Totals = serde_json::from_str(
        r#"{"steps":1,"tool_calls":0,"input_tokens":5,"output_tokens":1,"turn_events":1}"#,
    )
    .unwrap();
    assert_eq!(totals.cost, MicroUsd::ZERO);
    let limits: Limits = serde_json::from_str(r#"{"max_steps":3}"#).unwrap();
    assert_eq!(limits.max_cost, None);
    // And an unpriced usage is stored exactly as before.
    let json = serde_json::to_string(&costing(None)).unwrap();
    assert_eq!(json, r#"{"input_tokens":100,"output_tokens":10}"#);
    let json = serde_json::to_string(&costing(Some(7))).unwrap();
    assert_eq!(
        json,
        r#"{"input_tokens":100,"output_tokens":10,"cost_micro_usd":7}"#
    );
}

#[test]
fn a_failed_commit_ends_with_checkpoint_failed_and_no_next_turn() {
    let mut world = World::scripted(vec![
        tools(vec![lookup("a", "profile")]),
        final_answer("never"),
    ]);
    world.failing_commits = vec![0];
    let run = drive(Invocation::new(limits(), catalog()), world);
    assert_eq!(run.outcome.reason, TerminalReason::CheckpointFailed);
    assert_eq!(run.outcome.detail, "disk full");
    assert!(run.log.is_empty());
    assert_eq!(
        run.invocation.protocol().version,
        0,
        "nothing of the failed commit is applied"
    );
    assert_eq!(
        run.actions
            .iter()
            .filter(|a| matches!(a, Action::Decide { .. }))
            .count(),
        1
    );
}

#[test]
fn unknown_write_outcomes_are_reconciled_before_the_next_decision() {
    let mut world = World::scripted(vec![
        tools(vec![
            call("t1", "transfer", r#"{"amount":5}"#),
            lookup("l1", "profile"),
        ]),
        final_answer("moved 5"),
    ]);
    world.tool = Box::new(|call| match call.tool.as_str() {
        "transfer" => CallOutcome::Unknown {
            detail: "deadline exceeded after dispatch".into(),
        },
        _ => CallOutcome::Unknown {
            detail: "connection reset".into(),
        },
    });
    world.reconcile = Box::new(|_| Ok(output(r#"{"applied":true,"effect_id":"fx-1"}"#)));
    let run = drive(Invocation::new(limits(), catalog()), world);
    assert_eq!(run.outcome.reason, TerminalReason::Completed);
    let reconcile = run
        .actions
        .iter()
        .position(|a| matches!(a, Action::Reconcile { .. }))
        .unwrap();
    let second_decide = run
        .actions
        .iter()
        .rposition(|a| matches!(a, Action::Decide { .. }))
        .unwrap();
    assert!(reconcile < second_decide);
    // Only the write is reconciled; the read keeps its unknown outcome.
    let Action::Reconcile { calls, .. } = &run.actions[reconcile] else {
        unreachable!()
    };
    assert_eq!(
        calls.iter().map(|c| c.call_id.as_str()).collect::<Vec<_>>(),
        ["t1"]
    );
    let results = &turns(&run.log)[0].results;
    assert_eq!(
        results[0].outcome,
        output(r#"{"applied":true,"effect_id":"fx-1"}"#)
    );
    assert!(matches!(results[1].outcome, CallOutcome::Unknown { .. }));
}

#[test]
fn an_unreconcilable_write_ends_with_reconciliation_required() {
    let mut world = World::scripted(vec![
        tools(vec![call("t1", "transfer", r#"{"amount":5}"#)]),
        final_answer("never"),
    ]);
    world.tool = Box::new(|_| CallOutcome::Unknown {
        detail: "cut off".into(),
    });
    let run = drive(Invocation::new(limits(), catalog()), world);
    assert_eq!(run.outcome.reason, TerminalReason::ReconciliationRequired);
    assert!(run.outcome.detail.contains("t1"), "{}", run.outcome.detail);
    assert_eq!(
        run.actions
            .iter()
            .filter(|a| matches!(a, Action::Decide { .. }))
            .count(),
        1
    );
    // The unknown outcome is committed as unknown, never as a failure or a success.
    assert!(matches!(
        turns(&run.log)[0].results[0].outcome,
        CallOutcome::Unknown { .. }
    ));
}

// ---- Step-by-step transitions: cancellation, deadlines, refused inputs. ----

fn started(limits: Limits) -> Invocation {
    let mut invocation = Invocation::new(limits, catalog());
    assert_eq!(
        invocation.step(Input::Start, UnixMillis(0)).unwrap(),
        vec![Action::Decide { turn: 1 }]
    );
    invocation
}

fn decide(invocation: &mut Invocation, decision: ProposedDecision, now: u64) -> Vec<Action> {
    invocation
        .step(
            Input::Decided {
                decision,
                usage: Usage::default(),
            },
            UnixMillis(now),
        )
        .unwrap()
}

fn commit_events(actions: &[Action]) -> &[Event] {
    match actions {
        [Action::Commit { events, .. }] => events,
        other => panic!("expected one Commit, got {other:?}"),
    }
}

fn end_of(events: &[Event]) -> TerminalReason {
    match &events.last().unwrap().body {
        EventBody::Ended(end) => end.reason,
        other => panic!("no end: {other:?}"),
    }
}

/// Takes an invocation to the Executing phase with two lookups.
fn executing(limits: Limits) -> Invocation {
    let mut invocation = started(limits);
    decide(
        &mut invocation,
        tools(vec![lookup("a", "profile"), lookup("b", "policy")]),
        0,
    );
    let actions = invocation
        .step(Input::Authorized(Verdict::Allow.into()), UnixMillis(0))
        .unwrap();
    assert!(matches!(actions.as_slice(), [Action::Execute { .. }]));
    invocation
}

#[test]
fn cancel_while_deciding_ends_without_a_turn() {
    let mut invocation = started(limits());
    let actions = invocation.step(cancel(), UnixMillis(1)).unwrap();
    let events = commit_events(&actions);
    assert_eq!(events.len(), 1);
    assert_eq!(end_of(events), TerminalReason::Cancelled);
    // The model's late answer is refused, not acted on.
    let late = invocation.step(
        Input::Decided {
            decision: final_answer("x"),
            usage: Usage::default(),
        },
        UnixMillis(2),
    );
    assert_eq!(
        late,
        Err(StepError::Unexpected {
            input: "decided",
            phase: "committing"
        })
    );
    let finish = invocation.step(Input::Committed, UnixMillis(3)).unwrap();
    assert!(matches!(&finish[..], [Action::Finish(o)] if o.reason == TerminalReason::Cancelled));
    assert_eq!(
        invocation.step(cancel(), UnixMillis(4)),
        Ok(vec![]),
        "cancel after the end is a no-op"
    );
}

#[test]
fn cancel_while_executing_cancels_calls_and_commits_every_result() {
    let mut invocation = executing(limits());
    invocation
        .step(
            Input::CallFinished {
                call_id: CallId::new("b"),
                outcome: output("{}"),
            },
            UnixMillis(1),
        )
        .unwrap();
    assert_eq!(
        invocation.step(cancel(), UnixMillis(2)).unwrap(),
        vec![Action::CancelCalls { turn: 1 }]
    );
    assert_eq!(
        invocation.step(cancel(), UnixMillis(3)).unwrap(),
        vec![],
        "a second cancel adds nothing"
    );
    let actions = invocation
        .step(
            Input::CallFinished {
                call_id: CallId::new("a"),
                outcome: CallOutcome::Cancelled,
            },
            UnixMillis(4),
        )
        .unwrap();
    let events = commit_events(&actions);
    let EventBody::Turn(turn) = &events[0].body else {
        panic!()
    };
    assert_eq!(
        turn.results
            .iter()
            .map(|r| (r.call_id.as_str(), r.outcome.clone()))
            .collect::<Vec<_>>(),
        [("a", CallOutcome::Cancelled), ("b", output("{}"))]
    );
    assert_eq!(end_of(events), TerminalReason::Cancelled);
    let finish = invocation.step(Input::Committed, UnixMillis(5)).unwrap();
    assert!(
        matches!(&finish[..], [Action::Finish(o)] if o.reason == TerminalReason::Cancelled && o.totals.tool_calls == 2)
    );
}

#[test]
fn cancel_while_committing_a_turn_ends_after_the_commit_without_a_new_decision() {
    let mut invocation = executing(limits());
    invocation
        .step(
            Input::CallFinished {
                call_id: CallId::new("a"),
                outcome: output("{}"),
            },
            UnixMillis(0),
        )
        .unwrap();
    let actions = invocation
        .step(
            Input::CallFinished {
                call_id: CallId::new("b"),
                outcome: output("{}"),
            },
            UnixMillis(0),
        )
        .unwrap();
    assert_eq!(commit_events(&actions).len(), 1);
    assert_eq!(invocation.step(cancel(), UnixMillis(1)).unwrap(), vec![]);
    let actions = invocation.step(Input::Committed, UnixMillis(2)).unwrap();
    let events = commit_events(&actions);
    assert_eq!(events[0].seq, 2);
    assert_eq!(end_of(events), TerminalReason::Cancelled);
}

#[test]
fn cancel_while_authorizing_or_verifying_records_the_decision_as_stopped() {
    let mut invocation = started(limits());
    decide(&mut invocation, tools(vec![lookup("a", "profile")]), 0);
    let events = commit_events(&invocation.step(cancel(), UnixMillis(0)).unwrap()).to_vec();
    let EventBody::Turn(turn) = &events[0].body else {
        panic!()
    };
    assert_eq!(
        turn.rejection.as_ref().map(|r| r.kind),
        Some(RejectionKind::Stopped)
    );
    assert_eq!(end_of(&events), TerminalReason::Cancelled);

    let mut invocation = started(limits());
    decide(&mut invocation, final_answer("42"), 0);
    let events = commit_events(&invocation.step(cancel(), UnixMillis(0)).unwrap()).to_vec();
    assert_eq!(end_of(&events), TerminalReason::Cancelled);
}

#[test]
fn the_deadline_cancels_running_calls_on_a_tick() {
    let limits = Limits {
        deadline: Some(UnixMillis(100)),
        ..limits()
    };
    let mut invocation = executing(limits);
    assert_eq!(
        invocation.step(Input::Tick, UnixMillis(99)).unwrap(),
        vec![],
        "not yet"
    );
    assert_eq!(
        invocation.step(Input::Tick, UnixMillis(100)).unwrap(),
        vec![Action::CancelCalls { turn: 1 }]
    );
    invocation
        .step(
            Input::CallFinished {
                call_id: CallId::new("a"),
                outcome: CallOutcome::Cancelled,
            },
            UnixMillis(101),
        )
        .unwrap();
    let actions = invocation
        .step(
            Input::CallFinished {
                call_id: CallId::new("b"),
                outcome: CallOutcome::NotStarted,
            },
            UnixMillis(102),
        )
        .unwrap();
    assert_eq!(
        end_of(commit_events(&actions)),
        TerminalReason::DeadlineExceeded
    );
}

#[test]
fn the_deadline_is_checked_at_the_turn_boundary_and_before_acting() {
    let limits = Limits {
        deadline: Some(UnixMillis(100)),
        ..limits()
    };
    let mut late_start = Invocation::new(limits, catalog());
    let actions = late_start.step(Input::Start, UnixMillis(100)).unwrap();
    assert_eq!(
        end_of(commit_events(&actions)),
        TerminalReason::DeadlineExceeded
    );

    let mut late_decision = started(limits);
    let actions = decide(&mut late_decision, tools(vec![lookup("a", "profile")]), 150);
    assert_eq!(
        end_of(commit_events(&actions)),
        TerminalReason::DeadlineExceeded
    );

    let mut late_verdict = started(limits);
    decide(&mut late_verdict, tools(vec![lookup("a", "profile")]), 10);
    let actions = late_verdict
        .step(Input::Authorized(Verdict::Allow.into()), UnixMillis(100))
        .unwrap();
    assert_eq!(
        end_of(commit_events(&actions)),
        TerminalReason::DeadlineExceeded,
        "no Execute after the deadline"
    );
}

#[test]
fn refused_inputs_leave_the_state_untouched() {
    let mut invocation = executing(limits());
    let before = format!("{invocation:?}");
    assert_eq!(
        invocation.step(
            Input::CallFinished {
                call_id: CallId::new("zzz"),
                outcome: output("{}")
            },
            UnixMillis(0)
        ),
        Err(StepError::UnknownCall(CallId::new("zzz")))
    );
    assert_eq!(format!("{invocation:?}"), before);
    invocation
        .step(
            Input::CallFinished {
                call_id: CallId::new("a"),
                outcome: output("{}"),
            },
            UnixMillis(0),
        )
        .unwrap();
    let before = format!("{invocation:?}");
    assert_eq!(
        invocation.step(
            Input::CallFinished {
                call_id: CallId::new("a"),
                outcome: output("{}")
            },
            UnixMillis(0)
        ),
        Err(StepError::DuplicateResult(CallId::new("a")))
    );
    assert_eq!(
        invocation.step(Input::Start, UnixMillis(0)),
        Err(StepError::Unexpected {
            input: "start",
            phase: "executing"
        })
    );
    assert_eq!(
        invocation.step(Input::Committed, UnixMillis(0)),
        Err(StepError::Unexpected {
            input: "committed",
            phase: "executing"
        })
    );
    assert_eq!(
        invocation.step(
            Input::Reconciled {
                call_id: CallId::new("a"),
                outcome: output("{}")
            },
            UnixMillis(0)
        ),
        Err(StepError::Unexpected {
            input: "reconciled",
            phase: "executing"
        })
    );
    assert_eq!(format!("{invocation:?}"), before);
}

#[test]
fn a_reconciliation_answer_for_a_call_not_waiting_is_refused() {
    let mut invocation = started(limits());
    decide(
        &mut invocation,
        tools(vec![
            call("t1", "transfer", "{}"),
            call("t2", "transfer", "{}"),
        ]),
        0,
    );
    let actions = invocation
        .step(Input::Authorized(Verdict::Allow.into()), UnixMillis(0))
        .unwrap();
    commit_events(&actions);
    let actions = invocation.step(Input::Committed, UnixMillis(0)).unwrap();
    let [Action::Execute { plan, .. }] = actions.as_slice() else {
        panic!()
    };
    assert_eq!(
        plan.stages,
        vec![vec![0], vec![1]],
        "writes run one at a time, in call order"
    );
    invocation
        .step(
            Input::CallFinished {
                call_id: CallId::new("t1"),
                outcome: CallOutcome::Unknown {
                    detail: "timeout".into(),
                },
            },
            UnixMillis(0),
        )
        .unwrap();
    let actions = invocation
        .step(
            Input::CallFinished {
                call_id: CallId::new("t2"),
                outcome: output("{}"),
            },
            UnixMillis(0),
        )
        .unwrap();
    assert!(matches!(&actions[..], [Action::Reconcile { calls, .. }] if calls.len() == 1));
    assert_eq!(
        invocation.step(
            Input::Reconciled {
                call_id: CallId::new("t2"),
                outcome: output("{}")
            },
            UnixMillis(0)
        ),
        Err(StepError::NotReconciling(CallId::new("t2")))
    );
    // A cancel while reconciling waits for the executor's answer, then stops.
    assert_eq!(invocation.step(cancel(), UnixMillis(0)).unwrap(), vec![]);
    let actions = invocation
        .step(
            Input::Reconciled {
                call_id: CallId::new("t1"),
                outcome: output(r#"{"applied":false}"#),
            },
            UnixMillis(0),
        )
        .unwrap();
    assert_eq!(end_of(commit_events(&actions)), TerminalReason::Cancelled);
}

#[test]
fn every_terminal_reason_is_reachable() {
    // The tests above reach each reason; this one keeps the list honest when a reason is
    // added to the vocabulary: add its scenario here too.
    let reached = [
        run(vec![final_answer("ok")]).outcome.reason,
        run(vec![ProposedDecision::RequestApproval {
            summary: "s".into(),
            calls: vec![lookup("a", "k")],
        }])
        .outcome
        .reason,
        run(vec![ProposedDecision::Clarification {
            question: "q".into(),
        }])
        .outcome
        .reason,
        run(vec![ProposedDecision::CannotContinue {
            reason: "r".into(),
        }])
        .outcome
        .reason,
        run(vec![tools(vec![])]).outcome.reason,
        run(vec![]).outcome.reason,
    ];
    assert_eq!(
        reached,
        [
            TerminalReason::Completed,
            TerminalReason::ApprovalRequired,
            TerminalReason::ClarificationRequired,
            TerminalReason::CannotContinue,
            TerminalReason::InvalidDecision,
            TerminalReason::ModelError,
        ]
    );
}

// ---------------------------------------------------------------------------------------
// A batch with writes is committed as started before anything is sent.

const TRANSFER: &str = r#"{"to":"acct-1","amount":40}"#;

/// Authorizes one transfer; returns the actions of the `Authorized` step.
fn authorized_transfer(invocation: &mut Invocation) -> Vec<Action> {
    decide(invocation, tools(vec![call("t1", "transfer", TRANSFER)]), 0);
    invocation
        .step(Input::Authorized(Verdict::Allow.into()), UnixMillis(0))
        .unwrap()
}

#[test]
fn a_batch_with_writes_is_committed_as_started_before_it_runs() {
    let mut invocation = started(limits());
    let actions = authorized_transfer(&mut invocation);
    let events = commit_events(&actions);
    let [
        Event {
            seq: 1,
            body: EventBody::BatchStarted(record),
        },
    ] = events
    else {
        panic!("expected BatchStarted at seq 1, got {events:?}");
    };
    assert_eq!(record.turn, 1);
    assert!(record.plan.is_some() && record.results.is_empty());
    assert_eq!(invocation.phase_name(), "starting");
    // Nothing is sent until the start is durable.
    let actions = invocation.step(Input::Committed, UnixMillis(0)).unwrap();
    assert!(matches!(
        actions.as_slice(),
        [Action::Execute { turn: 1, .. }]
    ));
    assert_eq!(invocation.protocol().started, Some(1));
    let actions = invocation
        .step(
            Input::CallFinished {
                call_id: CallId::new("t1"),
                outcome: output(r#"{"receipt":"txn-1"}"#),
            },
            UnixMillis(0),
        )
        .unwrap();
    let events = commit_events(&actions);
    assert!(matches!(&events[0], Event { seq: 2, body: EventBody::Turn(t) } if t.turn == 1));
    invocation.step(Input::Committed, UnixMillis(0)).unwrap();
    let protocol = invocation.protocol();
    assert_eq!(
        (
            protocol.started,
            protocol.totals.steps,
            protocol.totals.tool_calls
        ),
        (None, 1, 1),
        "the start counts nothing; the turn does"
    );
}

#[test]
fn read_only_batches_are_not_committed_as_started() {
    let mut invocation = started(limits());
    decide(&mut invocation, tools(vec![lookup("a", "profile")]), 0);
    let actions = invocation
        .step(Input::Authorized(Verdict::Allow.into()), UnixMillis(0))
        .unwrap();
    assert!(matches!(actions.as_slice(), [Action::Execute { .. }]));
}

/// The log of a worker that died after starting a transfer batch.
fn started_log() -> Vec<Event> {
    let mut invocation = started(limits());
    let actions = authorized_transfer(&mut invocation);
    commit_events(&actions).to_vec()
}

#[test]
fn a_restored_started_batch_runs_again_without_asking_the_model() {
    let log = started_log();
    let mut restored = Invocation::restore(limits(), catalog(), &log).unwrap();
    assert_eq!(restored.phase_name(), "resuming");
    // Policy checks it again first, with the policies in force now.
    let actions = restored.step(Input::Start, UnixMillis(0)).unwrap();
    let [
        Action::Authorize {
            turn: 1,
            approved: None,
            ..
        },
    ] = actions.as_slice()
    else {
        panic!("expected the started batch put to policy again, got {actions:?}");
    };
    let actions = restored
        .step(Input::Authorized(Verdict::Allow.into()), UnixMillis(0))
        .unwrap();
    let [
        Action::Execute {
            turn: 1,
            calls,
            refused,
            ..
        },
    ] = actions.as_slice()
    else {
        panic!("expected the started batch again, got {actions:?}");
    };
    assert!(refused.is_empty());
    assert_eq!(calls[0].call_id, CallId::new("t1"));
    assert_eq!(calls[0].arguments_json, TRANSFER);
    let actions = restored
        .step(
            Input::CallFinished {
                call_id: CallId::new("t1"),
                outcome: output("{}"),
            },
            UnixMillis(0),
        )
        .unwrap();
    let events = commit_events(&actions);
    assert!(
        matches!(&events[0], Event { seq: 2, body: EventBody::Turn(t) } if t.turn == 1 && t.results.len() == 1)
    );
}

#[test]
fn cancelling_a_restored_started_batch_settles_its_calls_first() {
    let log = started_log();
    let mut restored = Invocation::restore(limits(), catalog(), &log).unwrap();
    let actions = restored.step(cancel(), UnixMillis(0)).unwrap();
    assert!(
        matches!(
            actions.as_slice(),
            [
                Action::Execute { turn: 1, .. },
                Action::CancelCalls { turn: 1 }
            ]
        ),
        "{actions:?}"
    );
    // The write may have been sent before the crash: its outcome is unknown, so it is
    // reconciled before anything is committed.
    let actions = restored
        .step(
            Input::CallFinished {
                call_id: CallId::new("t1"),
                outcome: CallOutcome::Unknown {
                    detail: "cancelled while in flight".into(),
                },
            },
            UnixMillis(0),
        )
        .unwrap();
    assert!(matches!(
        actions.as_slice(),
        [Action::Reconcile { turn: 1, .. }]
    ));
    let actions = restored
        .step(
            Input::Reconciled {
                call_id: CallId::new("t1"),
                outcome: output("{}"),
            },
            UnixMillis(0),
        )
        .unwrap();
    let events = commit_events(&actions);
    assert!(matches!(&events[0].body, EventBody::Turn(t) if t.results.len() == 1));
    assert_eq!(end_of(events), TerminalReason::Cancelled);
}

#[test]
fn a_cancel_while_the_start_commits_sends_nothing() {
    let mut invocation = started(limits());
    authorized_transfer(&mut invocation);
    assert!(invocation.step(cancel(), UnixMillis(0)).unwrap().is_empty());
    let actions = invocation.step(Input::Committed, UnixMillis(0)).unwrap();
    let events = commit_events(&actions);
    let EventBody::Turn(turn) = &events[0].body else {
        panic!("{events:?}");
    };
    assert_eq!(turn.results[0].outcome, CallOutcome::NotStarted);
    assert_eq!(end_of(events), TerminalReason::Cancelled);
}

#[test]
fn a_started_batch_that_is_not_valid_does_not_restore() {
    let mut log = started_log();
    let EventBody::BatchStarted(record) = &mut log[0].body else {
        panic!()
    };
    record.decision = final_answer("not a batch");
    assert!(matches!(
        Invocation::restore(limits(), catalog(), &log),
        Err(RestoreError::InvalidStartedBatch(1, _))
    ));
}

// ---------------------------------------------------------------------------------------
// Authorization: refusals per call, checked again at dispatch, the policy version.

fn refusal(call_id: &str, policy: &str) -> Refusal {
    Refusal {
        call_id: CallId::new(call_id),
        error_type: ErrorType::PermissionDenied,
        message: format!("permission denied by policy {policy}"),
        policies: vec![policy.to_owned()],
    }
}

#[test]
fn a_denied_batch_is_committed_with_one_refusal_per_refused_call_and_the_policy_version() {
    let mut invocation = started(limits());
    decide(
        &mut invocation,
        tools(vec![
            lookup("a", "profile"),
            call("t1", "transfer", TRANSFER),
        ]),
        0,
    );
    let denied = Authorization {
        verdict: Verdict::Deny {
            reason: "permission denied by policy no-transfers".into(),
            refusals: vec![refusal("t1", "no-transfers")],
        },
        policy: Some("v1".into()),
        permits: Vec::new(),
    };
    let actions = invocation
        .step(Input::Authorized(denied), UnixMillis(0))
        .unwrap();
    let events = commit_events(&actions);
    let EventBody::Turn(turn) = &events[0].body else {
        panic!("expected the rejected turn, got {events:?}");
    };
    assert!(turn.results.is_empty(), "nothing ran");
    assert_eq!(turn.policy.as_deref(), Some("v1"));
    let rejection = turn.rejection.as_ref().unwrap();
    assert_eq!(rejection.kind, RejectionKind::InvalidDecision);
    assert_eq!(rejection.refusals, vec![refusal("t1", "no-transfers")]);
    assert!(rejection.message.contains("no-transfers"));
}

/// The policies that permitted each call are committed with the turn that ran them.
#[test]
fn an_allowed_batch_is_committed_with_the_policies_that_permitted_each_call() {
    let mut invocation = started(limits());
    decide(&mut invocation, tools(vec![lookup("a", "profile")]), 0);
    let permits = vec![Permit {
        call_id: CallId::new("a"),
        policies: vec!["lookups-for-everyone".into()],
    }];
    let allowed = Authorization {
        verdict: Verdict::Allow,
        policy: Some("v2".into()),
        permits: permits.clone(),
    };
    let actions = invocation
        .step(Input::Authorized(allowed), UnixMillis(0))
        .unwrap();
    assert!(matches!(actions.as_slice(), [Action::Execute { .. }]));
    let actions = invocation
        .step(
            Input::CallFinished {
                call_id: CallId::new("a"),
                outcome: output("{}"),
            },
            UnixMillis(1),
        )
        .unwrap();
    let events = commit_events(&actions);
    let EventBody::Turn(turn) = &events[0].body else {
        panic!("expected the turn, got {events:?}");
    };
    assert_eq!(turn.results.len(), 1, "the call ran");
    assert_eq!(turn.policy.as_deref(), Some("v2"));
    assert_eq!(turn.permits, permits);
}

#[test]
fn repeated_denials_end_invalid_decision_naming_the_policy() {
    let script = vec![tools(vec![call("t1", "transfer", TRANSFER)]); 5];
    let mut world = World::scripted(script);
    world.policy = Box::new(|_| Verdict::Deny {
        reason: "permission denied by policy no-transfers".into(),
        refusals: vec![refusal("t1", "no-transfers")],
    });
    let run = drive(Invocation::new(limits(), catalog()), world);
    assert_eq!(run.outcome.reason, TerminalReason::InvalidDecision);
    assert!(
        run.outcome.detail.contains("no-transfers"),
        "{}",
        run.outcome.detail
    );
    assert!(run.executed.is_empty());
}

#[test]
fn a_resumed_batch_refused_at_dispatch_sends_nothing_it_refuses() {
    let log = started_log();
    let mut restored = Invocation::restore(limits(), catalog(), &log).unwrap();
    restored.step(Input::Start, UnixMillis(0)).unwrap();
    let denied = Authorization {
        verdict: Verdict::Deny {
            reason: "permission denied by policy frozen".into(),
            refusals: vec![refusal("t1", "frozen")],
        },
        permits: Vec::new(),
        policy: Some("v2".into()),
    };
    let actions = restored
        .step(Input::Authorized(denied), UnixMillis(0))
        .unwrap();
    // No second `BatchStarted`: the batch runs, with the refusal for the runner, which
    // sends nothing refused and settles a write sent before the crash from its ledger.
    let [Action::Execute { refused, .. }] = actions.as_slice() else {
        panic!("expected the batch with its refusal, got {actions:?}");
    };
    assert_eq!(refused, &vec![refusal("t1", "frozen")]);
    let actions = restored
        .step(
            Input::CallFinished {
                call_id: CallId::new("t1"),
                outcome: refused[0].outcome(),
            },
            UnixMillis(0),
        )
        .unwrap();
    let events = commit_events(&actions);
    let EventBody::Turn(turn) = &events[0].body else {
        panic!("expected the turn, got {events:?}");
    };
    assert_eq!(
        turn.policy.as_deref(),
        Some("v2"),
        "the policies that judged it last"
    );
    assert!(
        matches!(&turn.results[0].outcome, CallOutcome::Error(e) if e.error_type == ErrorType::PermissionDenied)
    );
}

#[test]
fn a_cancel_while_a_resumed_batch_is_checked_still_settles_the_batch() {
    let log = started_log();
    let mut restored = Invocation::restore(limits(), catalog(), &log).unwrap();
    restored.step(Input::Start, UnixMillis(0)).unwrap();
    assert_eq!(restored.phase_name(), "authorizing");
    let actions = restored
        .step(
            Input::Cancel {
                reason: String::new(),
            },
            UnixMillis(0),
        )
        .unwrap();
    assert!(
        matches!(
            actions.as_slice(),
            [Action::Execute { .. }, Action::CancelCalls { turn: 1 }]
        ),
        "{actions:?}"
    );
}

/// A turn that ran calls records the contract version of each versioned tool it called,
/// and only of those: what the calls ran under, kept in the log.
#[test]
fn a_turn_records_the_contract_versions_of_the_tools_it_called() {
    let (lookup_v, transfer_v) = (ToolDigest([0xab; 16]), ToolDigest([0xcd; 16]));
    let versioned = |digest| ToolSpec {
        digest: Some(digest),
        ..ToolSpec::read_only()
    };
    let catalog = ToolCatalog::new().with("lookup", versioned(lookup_v)).with(
        "transfer",
        ToolSpec {
            side_effect: SideEffect::Write,
            ..versioned(transfer_v)
        },
    );
    let run = drive(
        Invocation::new(limits(), std::sync::Arc::new(catalog)),
        World::scripted(vec![
            tools(vec![lookup("call-a", "profile")]),
            final_answer("done"),
        ]),
    );
    assert_eq!(run.outcome.reason, TerminalReason::Completed);
    let turns = turns(&run.log);
    assert_eq!(
        turns[0].tools,
        [("lookup".to_owned(), lookup_v)].into_iter().collect()
    );
    // The final turn ran no calls and records none.
    assert!(turns[1].tools.is_empty());
    assert_eq!(lookup_v.to_string(), "ab".repeat(16));
    assert_eq!(lookup_v.to_string().parse::<ToolDigest>(), Ok(lookup_v));
    assert!("abc".parse::<ToolDigest>().is_err());
    assert!("zz".repeat(16).parse::<ToolDigest>().is_err());
}
