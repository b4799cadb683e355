//! Every scenario runs twice: against the services as separate gRPC servers, and against
//! the embedded in-process wiring.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use agentloop_e2e::*;
use agentloop_orchestrator::OrchestratorConfig;
use agentloop_proto::v1 as pb;
use futures::StreamExt;
use tonic::Code;

both_wirings!(
    demo_two_step_lookup,
    repeated_plan_is_no_progress,
    repeat_forever_without_detection_is_max_steps,
    invalid_decisions,
    schema_violation_is_refused_before_execution,
    cancel_stops_a_running_sleep,
    deadline_cancels_a_running_sleep,
    idempotent_start,
    watch_replays_after_reconnect,
    bad_input_is_refused_and_nothing_is_stored,
    cost_budget_override_stops_the_run,
    a_transfer_is_recorded_in_the_ledger_and_applied_once,
    an_error_quotes_only_a_bounded_excerpt_of_the_input,
    concurrent_starts_never_pass_max_running,
    watching_an_ended_invocation_past_its_end_ends_at_once,
);

const DEMO: &str = r#"{"turns": [
  {"tool_calls": [
    {"id": "call-profile", "name": "lookup", "arguments": {"key": "profile"}},
    {"id": "call-policy", "name": "lookup", "arguments": {"key": "policy"}}]},
  {"final": "profile=active; policy=refund-under-100"}]}"#;

async fn demo_two_step_lookup(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let (invocation, events) = run_to_end(&mut client, start_request(DEMO)).await;
    assert_eq!(reason(&invocation), pb::TerminalReason::Completed);
    assert_eq!(
        invocation.answer.as_deref(),
        Some("profile=active; policy=refund-under-100")
    );
    let usage = invocation.usage.unwrap();
    assert_eq!((usage.steps, usage.tool_calls), (2, 2));
    let turns = turns(&events);
    assert_eq!(turns.len(), 2);
    let ids: Vec<&str> = turns[0]
        .results
        .iter()
        .map(|r| r.call_id.as_str())
        .collect();
    assert_eq!(
        ids,
        ["call-profile", "call-policy"],
        "results are committed in call order"
    );
    assert!(
        turns[0]
            .results
            .iter()
            .all(|r| matches!(r.outcome, Some(pb::tool_result::Outcome::Output(_))))
    );
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    system.stop().await;
}

async fn repeated_plan_is_no_progress(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let script = r#"{"turns": [{"tool_calls": [{"id": "c", "name": "lookup", "arguments": {"key": "profile"}}]}], "repeat_last": true}"#;
    let mut request = start_request(script);
    request.budget_overrides = Some(pb::BudgetOverrides {
        max_repeated_plan: Some(1),
        ..Default::default()
    });
    let (invocation, events) = run_to_end(&mut client, request).await;
    assert_eq!(reason(&invocation), pb::TerminalReason::NoProgress);
    assert_eq!(
        invocation.usage.unwrap().tool_calls,
        1,
        "the repeat never executes"
    );
    assert_eq!(
        turns(&events)
            .iter()
            .filter(|t| !t.results.is_empty())
            .count(),
        1
    );
    system.stop().await;
}

async fn repeat_forever_without_detection_is_max_steps(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let script = r#"{"turns": [{"tool_calls": [{"id": "c", "name": "lookup", "arguments": {"key": "profile"}}]}], "repeat_last": true}"#;
    let mut request = start_request(script);
    request.budget_overrides = Some(pb::BudgetOverrides {
        max_repeated_plan: Some(0),
        max_steps: Some(4),
        ..Default::default()
    });
    let (invocation, _) = run_to_end(&mut client, request).await;
    assert_eq!(reason(&invocation), pb::TerminalReason::MaxSteps);
    let usage = invocation.usage.unwrap();
    assert_eq!((usage.steps, usage.tool_calls), (4, 4));
    system.stop().await;
}

async fn invalid_decisions(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let cases = [
        (
            r#"{"turns": [{"raw": "I will call lookup now"}]}"#,
            "not a decision",
        ),
        (
            r#"{"turns": [{"tool_calls": [{"id": "a", "name": "rm_rf", "arguments": {}}]}]}"#,
            "unknown tool",
        ),
        (
            r#"{"turns": [{"tool_calls": [{"id": "a", "name": "lookup", "arguments": {"key": "x"}}, {"id": "a", "name": "lookup", "arguments": {"key": "y"}}]}]}"#,
            "used twice",
        ),
        (r#"{"turns": [{"tool_calls": []}]}"#, "empty"),
        (
            r#"{"turns": [{"tool_calls": [{"id": "a", "name": "lookup", "arguments": [1, 2]}]}]}"#,
            "not a JSON object",
        ),
    ];
    for (script, needle) in cases {
        let (invocation, events) = run_to_end(&mut client, start_request(script)).await;
        assert_eq!(
            reason(&invocation),
            pb::TerminalReason::InvalidDecision,
            "{script}"
        );
        assert!(
            invocation.terminal_detail.contains(needle),
            "{:?} lacks {needle:?}",
            invocation.terminal_detail
        );
        assert_eq!(invocation.usage.unwrap().tool_calls, 0);
        assert!(turns(&events)[0].rejection.is_some());
    }
    system.stop().await;
}

async fn schema_violation_is_refused_before_execution(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let script = r#"{"turns": [{"tool_calls": [{"id": "a", "name": "transfer", "arguments": {"from": "acct-1", "to": "acct-2", "amount": "a lot"}}]}]}"#;
    let (invocation, _) = run_to_end(&mut client, start_request(script)).await;
    assert_eq!(reason(&invocation), pb::TerminalReason::InvalidDecision);
    assert!(
        invocation.terminal_detail.contains("denied by policy"),
        "{}",
        invocation.terminal_detail
    );
    assert!(
        invocation.terminal_detail.contains("amount"),
        "{}",
        invocation.terminal_detail
    );
    assert_eq!(
        system.executor().stats().applied,
        0,
        "nothing reached the executor"
    );
    system.stop().await;
}

/// Two long sleeps in one turn: one stage of reads, which the distributed wiring sends
/// to the gateway as one request.
const SLEEPS: &str = r#"{"turns": [{"tool_calls": [
  {"id": "s1", "name": "sleep", "arguments": {"ms": 60000}},
  {"id": "s2", "name": "sleep", "arguments": {"ms": 60000}}]}]}"#;

fn all_cancelled(turn: &pb::TurnCommitted) -> bool {
    turn.results.len() == 2
        && turn
            .results
            .iter()
            .all(|result| matches!(result.outcome, Some(pb::tool_result::Outcome::Cancelled(_))))
}

async fn cancel_stops_a_running_sleep(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let mut stats = system.executor().watch_stats();
    let id = start(&mut client, start_request(SLEEPS)).await;
    stats.wait_for(|s| s.sleeps_started == 2).await.unwrap();
    // While they run, the orchestrator reports where it is.
    let live = get(&mut client, &id).await;
    assert_eq!((live.current_turn, live.calls_in_flight), (1, 2));
    let cancelled = client
        .cancel_invocation(pb::CancelInvocationRequest {
            invocation_id: id.clone(),
            reason: "test".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(cancelled.invocation.is_some());
    let events = events_until_end(&mut client, &id, 1).await;
    // The executor saw both requests dropped.
    stats.wait_for(|s| s.sleeps_cancelled == 2).await.unwrap();
    let ended = get(&mut client, &id).await;
    assert_eq!(
        (ended.current_turn, ended.calls_in_flight),
        (0, 0),
        "an ended invocation has no live progress"
    );
    let turn = turns(&events)[0];
    assert!(all_cancelled(turn), "{turn:?}");
    match &events.last().unwrap().body {
        Some(pb::event::Body::Ended(ended)) => {
            assert_eq!(ended.reason(), pb::TerminalReason::Cancelled)
        }
        other => panic!("expected the end, got {other:?}"),
    }
    system.stop().await;
}

async fn deadline_cancels_a_running_sleep(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let mut request = start_request(SLEEPS);
    request.budget_overrides = Some(pb::BudgetOverrides {
        deadline: Some(prost_types::Duration {
            seconds: 0,
            nanos: 200_000_000,
        }),
        ..Default::default()
    });
    let (invocation, events) = run_to_end(&mut client, request).await;
    assert_eq!(reason(&invocation), pb::TerminalReason::DeadlineExceeded);
    assert!(all_cancelled(turns(&events)[0]), "{events:?}");
    system
        .executor()
        .watch_stats()
        .wait_for(|s| s.sleeps_cancelled == 2)
        .await
        .unwrap();
    system.stop().await;
}

async fn idempotent_start(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let mut request = start_request(DEMO);
    request.idempotency_key = "order-42".into();
    let first = client
        .start_invocation(request.clone())
        .await
        .unwrap()
        .into_inner();
    let second = client
        .start_invocation(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(first.created);
    assert!(!second.created);
    let id = first.invocation.unwrap().invocation_id;
    assert_eq!(second.invocation.unwrap().invocation_id, id);
    let mut different = request.clone();
    different.goal = "something else".into();
    let conflict = client.start_invocation(different).await.unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists);
    events_until_end(&mut client, &id, 1).await;
    let listed = client
        .list_invocations(pb::ListInvocationsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.invocations.len(), 1, "one run, never a second");
    system.stop().await;
}

async fn watch_replays_after_reconnect(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let script = r#"{"turns": [
      {"tool_calls": [{"id": "a", "name": "lookup", "arguments": {"key": "profile"}}]},
      {"tool_calls": [{"id": "b", "name": "lookup", "arguments": {"key": "policy"}}]},
      {"tool_calls": [{"id": "c", "name": "lookup", "arguments": {"key": "nope"}}]},
      {"final": "done"}]}"#;
    let id = start(&mut client, start_request(script)).await;
    // Read two events, then drop the stream as a disconnecting client would.
    let mut stream = client
        .watch_invocation(pb::WatchInvocationRequest {
            invocation_id: id.clone(),
            from_seq: 1,
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(stream.next().await.unwrap().unwrap().event.unwrap().seq);
    }
    drop(stream);
    let rest = events_until_end(&mut client, &id, seen[1] + 1).await;
    seen.extend(rest.iter().map(|e| e.seq));
    assert_eq!(seen, [1, 2, 3, 4, 5], "nothing missed, nothing twice");
    // A late watcher replays the whole log.
    let all = events_until_end(&mut client, &id, 0).await;
    assert_eq!(all.len(), 5);
    assert!(matches!(all[4].body, Some(pb::event::Body::Ended(_))));
    system.stop().await;
}

async fn bad_input_is_refused_and_nothing_is_stored(wiring: Wiring) {
    let mut config = OrchestratorConfig::default();
    config.bounds.max_goal_bytes = 1024;
    let system = System::start(wiring, config).await;
    let mut client = system.client().await;
    let base = start_request(DEMO);
    let refused: Vec<(&str, pb::StartInvocationRequest)> = vec![
        (
            "missing goal",
            pb::StartInvocationRequest {
                goal: String::new(),
                ..base.clone()
            },
        ),
        (
            "goal over the limit",
            pb::StartInvocationRequest {
                goal: "g".repeat(1025),
                ..base.clone()
            },
        ),
        (
            "malformed script",
            pb::StartInvocationRequest {
                scripted_model_json: "{not json".into(),
                ..base.clone()
            },
        ),
        (
            "unknown profile",
            pb::StartInvocationRequest {
                profile: "gold".into(),
                ..base.clone()
            },
        ),
        (
            "unknown tool",
            pb::StartInvocationRequest {
                allowed_tools: vec!["rm_rf".into()],
                ..base.clone()
            },
        ),
        (
            "zero steps",
            pb::StartInvocationRequest {
                budget_overrides: Some(pb::BudgetOverrides {
                    max_steps: Some(0),
                    ..Default::default()
                }),
                ..base.clone()
            },
        ),
        (
            "negative deadline",
            pb::StartInvocationRequest {
                budget_overrides: Some(pb::BudgetOverrides {
                    deadline: Some(prost_types::Duration {
                        seconds: -1,
                        nanos: 0,
                    }),
                    ..Default::default()
                }),
                ..base.clone()
            },
        ),
        (
            "key over the limit",
            pb::StartInvocationRequest {
                idempotency_key: "k".repeat(300),
                ..base.clone()
            },
        ),
    ];
    for (case, request) in refused {
        let status = client.start_invocation(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{case}: {status:?}");
        assert!(!status.message().is_empty(), "{case}");
    }
    let unknown = "0190aaaa-0000-7000-8000-000000000000".to_string();
    let get = client
        .get_invocation(pb::GetInvocationRequest {
            invocation_id: unknown.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(get.code(), Code::NotFound);
    let cancel = client
        .cancel_invocation(pb::CancelInvocationRequest {
            invocation_id: unknown.clone(),
            reason: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(cancel.code(), Code::NotFound);
    let watch = client
        .watch_invocation(pb::WatchInvocationRequest {
            invocation_id: unknown,
            from_seq: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(watch.code(), Code::NotFound);
    let malformed = client
        .get_invocation(pb::GetInvocationRequest {
            invocation_id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
    let bad_state = client
        .list_invocations(pb::ListInvocationsRequest {
            state: 99,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_state.code(), Code::InvalidArgument);
    let bad_token = client
        .list_invocations(pb::ListInvocationsRequest {
            page_token: "garbage".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_token.code(), Code::InvalidArgument);
    let listed = client
        .list_invocations(pb::ListInvocationsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed.invocations.is_empty(),
        "a refused request stores nothing"
    );
    system.stop().await;
}

/// A per-invocation cost budget: the second decision would cross it, so it is committed
/// as stopped and the run ends `token_budget_exhausted`, saying it was the cost.
async fn cost_budget_override_stops_the_run(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let script = r#"{"turns": [
      {"tool_calls": [{"id": "a", "name": "lookup", "arguments": {"key": "profile"}}],
       "usage": {"cost_micro_usd": 600}},
      {"tool_calls": [{"id": "b", "name": "lookup", "arguments": {"key": "policy"}}],
       "usage": {"cost_micro_usd": 600}},
      {"final": "never"}]}"#;
    let mut request = start_request(script);
    request.budget_overrides = Some(pb::BudgetOverrides {
        max_cost_micro_usd: Some(1_000),
        ..Default::default()
    });
    let (invocation, _events) = run_to_end(&mut client, request).await;
    assert_eq!(
        reason(&invocation),
        pb::TerminalReason::TokenBudgetExhausted
    );
    assert!(
        invocation.terminal_detail.contains("cost budget"),
        "{}",
        invocation.terminal_detail
    );
    let usage = invocation.usage.unwrap();
    assert_eq!(
        usage.steps, 2,
        "the crossing decision is committed, not run"
    );
    assert_eq!(usage.tool_calls, 1);
    system.stop().await;
}

/// A write goes through the ledger: applied once by the executor, its entry settled
/// (nothing left unresolved), its receipt in the call's output.
async fn a_transfer_is_recorded_in_the_ledger_and_applied_once(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let script = r#"{"turns": [
      {"tool_calls": [{"id": "t", "name": "transfer",
                       "arguments": {"from": "alice", "to": "bob", "amount": 4200}}]},
      {"final": "moved"}]}"#;
    let (invocation, events) = run_to_end(&mut client, start_request(script)).await;
    assert_eq!(reason(&invocation), pb::TerminalReason::Completed);
    let turns = turns(&events);
    assert!(
        matches!(
            &turns[0].results[0].outcome,
            Some(pb::tool_result::Outcome::Output(output)) if output.output_json.contains("txn-")
        ),
        "{:?}",
        turns[0].results
    );
    assert_eq!(system.executor().stats().applied, 1);
    let unresolved = client
        .list_unresolved_effects(pb::ListUnresolvedEffectsRequest {
            invocation_id: invocation.invocation_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(unresolved.entries.is_empty(), "{:?}", unresolved.entries);
    system.stop().await;
}

/// A huge ID is refused with its own code and a short message: never echoed whole, which
/// a stock client would report as RESOURCE_EXHAUSTED (the trailer too large).
async fn an_error_quotes_only_a_bounded_excerpt_of_the_input(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let huge = "x".repeat(1024 * 1024);
    let bounded = |status: tonic::Status, code: Code| {
        let excerpt: String = status.message().chars().take(200).collect();
        assert_eq!(status.code(), code, "{excerpt}");
        assert!(
            status.message().len() <= agentloop_proto::MAX_STATUS_MESSAGE_BYTES,
            "{} bytes",
            status.message().len()
        );
    };
    let get = client
        .get_invocation(pb::GetInvocationRequest {
            invocation_id: huge.clone(),
        })
        .await
        .unwrap_err();
    bounded(get, Code::InvalidArgument);
    let cancel = client
        .cancel_invocation(pb::CancelInvocationRequest {
            invocation_id: huge.clone(),
            reason: String::new(),
        })
        .await
        .unwrap_err();
    bounded(cancel, Code::InvalidArgument);
    if let Some(mut ledger) = system.ledger().await {
        let entry = ledger
            .get(pb::GetRequest { effect_key: huge })
            .await
            .unwrap_err();
        bounded(entry, Code::InvalidArgument);
    }
    system.stop().await;
}

/// Many starts at once against a small `max_running`: exactly the bound is accepted, and
/// every other start is RESOURCE_EXHAUSTED naming it.
async fn concurrent_starts_never_pass_max_running(wiring: Wiring) {
    const BOUND: usize = 4;
    const STARTS: usize = 40;
    let mut config = OrchestratorConfig::default();
    config.bounds.max_running = BOUND;
    let system = System::start(wiring, config).await;
    // Each invocation waits in its first model call, so none ends and frees its slot.
    let waiting = r#"{"turns": [{"final": "done", "delay_ms": 600000}]}"#;
    let client = system.client().await;
    let starts = (0..STARTS).map(|_| {
        let mut client = client.clone();
        async move { client.start_invocation(start_request(waiting)).await }
    });
    let answers = futures::future::join_all(starts).await;
    let mut accepted = 0;
    for answer in answers {
        match answer {
            Ok(_) => accepted += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(status.message().contains(&BOUND.to_string()), "{status:?}");
            }
        }
    }
    assert_eq!(accepted, BOUND);
    system.stop().await;
}

/// A watch of an ended invocation from beyond its last event is an empty stream that
/// ends; from its last event, that event and the end.
async fn watching_an_ended_invocation_past_its_end_ends_at_once(wiring: Wiring) {
    let system = System::start(wiring, OrchestratorConfig::default()).await;
    let mut client = system.client().await;
    let (invocation, events) = run_to_end(&mut client, start_request(DEMO)).await;
    let last = invocation.last_seq;
    assert_eq!(events.last().map(|e| e.seq), Some(last));
    let watch = |from_seq: u64| {
        let mut client = client.clone();
        let id = invocation.invocation_id.clone();
        async move {
            let stream = client
                .watch_invocation(pb::WatchInvocationRequest {
                    invocation_id: id,
                    from_seq,
                })
                .await
                .unwrap()
                .into_inner();
            // A bound on the test, not a synchronisation: a stream that does not end
            // fails here instead of hanging.
            tokio::time::timeout(
                std::time::Duration::from_secs(10),
                stream.collect::<Vec<_>>(),
            )
            .await
            .expect("the stream of an ended invocation ends")
        }
    };
    assert!(watch(last + 1).await.is_empty());
    assert!(watch(last + 1_000).await.is_empty());
    let tail = watch(last).await;
    assert_eq!(tail.len(), 1);
    assert_eq!(tail[0].as_ref().unwrap().event.as_ref().unwrap().seq, last);
    system.stop().await;
}
