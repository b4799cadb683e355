//! A tool that asks a person for input (an MCP server's elicitation): the invocation
//! waits with the question and its schema, and the answer reopens the turn, sending the
//! asking call again with it and nothing else.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::sync::Arc;

use agentloop_engine::*;
use agentloop_testkit::*;

fn limits() -> Limits {
    Limits {
        max_wait_ms: 60_000,
        ..Limits::default()
    }
}

/// The demo tools, and `ask` (read-only) and `ask_write` (a write) that ask a person.
fn asking_catalog() -> Arc<ToolCatalog> {
    Arc::new(
        ToolCatalog::new()
            .with("lookup", ToolSpec::read_only())
            .with("ask", ToolSpec::read_only())
            .with("ask_write", ToolSpec::new(SideEffect::Write)),
    )
}

/// A world whose `ask` tools always ask (the harness answers a call sent with an answer
/// with what it was given).
fn world(script: Vec<ProposedDecision>) -> World {
    let mut world = World::scripted(script);
    world.tool = Box::new(|call| match call.tool.as_str() {
        "ask" | "ask_write" => asks(),
        _ => demo_tool(call),
    });
    world
}

fn ask_and_lookup() -> Vec<ProposedDecision> {
    vec![
        tools(vec![lookup("l1", "profile"), call("a1", "ask", "{}")]),
        final_answer("done"),
    ]
}

fn last_end(log: &[Event]) -> &EndRecord {
    match &log.last().expect("a log").body {
        EventBody::Ended(end) => end,
        other => panic!("the log does not end with Ended: {other:?}"),
    }
}

fn turns(log: &[Event]) -> Vec<&TurnRecord> {
    log.iter()
        .filter_map(|event| match &event.body {
            EventBody::Turn(record) => Some(record),
            _ => None,
        })
        .collect()
}

fn answered_with(log: &[Event], reply_with: Reply) -> Vec<Event> {
    let body = reply(last_end(log), reply_with, UnixMillis(0)).unwrap();
    let mut log = log.to_vec();
    let seq = log.len() as u64 + 1;
    log.push(Event { seq, body });
    log
}

fn accept(content: &str) -> Reply {
    Reply::Answer {
        answer: content.into(),
        actor: "ana".into(),
        action: Some(InputAction::Accept),
    }
}

#[test]
fn a_tool_that_asks_makes_the_invocation_wait_with_its_question_and_schema() {
    let catalog = asking_catalog();
    let run = drive(
        Invocation::new(limits(), Arc::clone(&catalog)),
        world(ask_and_lookup()),
    );
    assert_eq!(run.outcome.reason, TerminalReason::ClarificationRequired);
    assert_eq!(run.outcome.detail, "which account?");
    let end = last_end(&run.log);
    assert!(end.waits());
    let input = end.input.as_deref().expect("the tool's question");
    assert_eq!(input.call_id.as_str(), "a1");
    assert_eq!(input.tool, "ask");
    let CallOutcome::InputRequired(request) = asks() else {
        unreachable!()
    };
    assert_eq!(input.schema_json, request.schema_json);
    // The turn is committed with every call's result, the question among them.
    let [turn] = turns(&run.log)[..] else {
        panic!("one turn")
    };
    assert_eq!(turn.results.len(), 2);
    assert!(matches!(
        turn.results[1].outcome,
        CallOutcome::InputRequired(_)
    ));
    assert!(matches!(
        turn.results[0].outcome,
        CallOutcome::Output { .. }
    ));
    // The call that asked has not finished: it is not counted yet.
    assert_eq!(run.outcome.totals.tool_calls, 1);
}

#[test]
fn an_accepted_answer_sends_only_the_asking_call_again_in_the_same_turn() {
    let catalog = asking_catalog();
    let waiting = drive(
        Invocation::new(limits(), Arc::clone(&catalog)),
        world(ask_and_lookup()),
    );
    let log = answered_with(&waiting.log, accept(r#"{"answer":"acct-1"}"#));
    let answer_seq = log.len() as u64;
    let restored = Invocation::restore(limits(), Arc::clone(&catalog), &log).unwrap();
    let run = drive_from(restored, world(ask_and_lookup()), log);
    assert_eq!(run.outcome.reason, TerminalReason::Completed);

    // Only `a1` ran again, with the answer; `l1` kept its result.
    let ids: Vec<&str> = run.executed.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, ["a1"]);
    let sent: Vec<&InputAnswer> = run
        .actions
        .iter()
        .filter_map(|action| match action {
            Action::Execute { answer, .. } => answer.as_deref(),
            _ => None,
        })
        .collect();
    let [sent] = sent[..] else {
        panic!("one answered send: {sent:?}")
    };
    assert_eq!(sent.call_id.as_str(), "a1");
    assert_eq!(sent.action, InputAction::Accept);
    assert_eq!(sent.content_json, r#"{"answer":"acct-1"}"#);
    assert_eq!(sent.seq, answer_seq);

    // Turn 1 is committed again, with both results; the model is asked turn 2 after it.
    let turns = turns(&run.log);
    assert_eq!(
        turns.iter().map(|t| t.turn).collect::<Vec<_>>(),
        [1, 1, 2],
        "the reopened turn is committed again"
    );
    let reopened = turns[1];
    assert_eq!(reopened.usage, Usage::default(), "its tokens counted once");
    assert_eq!(reopened.plan, turns[0].plan);
    assert_eq!(reopened.results[0], turns[0].results[0]);
    assert_eq!(
        reopened.results[1].outcome,
        output(r#"{"action":"accept","content":{"answer":"acct-1"}}"#)
    );
    // Each call counted once; the plan ran once.
    assert_eq!(run.outcome.totals.tool_calls, 2);
    assert_eq!(run.outcome.totals.steps, 2);
    assert_eq!(run.invocation.protocol().last_plan.map(|p| p.1), Some(1));
    // The live state is what the log folds into.
    let restored = Invocation::restore(limits(), catalog, &run.log).unwrap();
    assert_eq!(restored.protocol(), run.invocation.protocol());
}

#[test]
fn a_decline_and_a_cancel_are_sent_to_the_tool_as_they_are() {
    for action in [InputAction::Decline, InputAction::Cancel] {
        let catalog = asking_catalog();
        let waiting = drive(
            Invocation::new(limits(), Arc::clone(&catalog)),
            world(ask_and_lookup()),
        );
        let declined = Reply::Answer {
            answer: String::new(),
            actor: "ana".into(),
            action: Some(action),
        };
        let log = answered_with(&waiting.log, declined);
        let restored = Invocation::restore(limits(), Arc::clone(&catalog), &log).unwrap();
        let run = drive_from(restored, world(ask_and_lookup()), log);
        assert_eq!(run.outcome.reason, TerminalReason::Completed);
        let reopened = turns(&run.log)[1];
        let expected = format!(r#"{{"action":"{}","content":null}}"#, action.as_str());
        assert_eq!(reopened.results[1].outcome, output(&expected));
    }
}

#[test]
fn a_reply_must_fit_the_question() {
    let catalog = asking_catalog();
    let tool_asks = drive(
        Invocation::new(limits(), Arc::clone(&catalog)),
        world(ask_and_lookup()),
    );
    let end = last_end(&tool_asks.log);
    let words = Reply::Answer {
        answer: "acct-1".into(),
        actor: "ana".into(),
        action: None,
    };
    assert!(matches!(
        reply(end, words.clone(), UnixMillis(0)),
        Err(ReplyError::OtherKind { .. })
    ));
    assert!(matches!(
        reply(end, accept(""), UnixMillis(0)),
        Err(ReplyError::Content(_))
    ));
    let declined_with_content = Reply::Answer {
        answer: "{}".into(),
        actor: "ana".into(),
        action: Some(InputAction::Decline),
    };
    assert!(matches!(
        reply(end, declined_with_content, UnixMillis(0)),
        Err(ReplyError::Content(_))
    ));

    let model_asks = drive(
        Invocation::new(limits(), catalog),
        World::scripted(vec![ProposedDecision::Clarification {
            question: "which account?".into(),
        }]),
    );
    let end = last_end(&model_asks.log);
    assert!(end.input.is_none());
    assert!(matches!(
        reply(end, accept("{}"), UnixMillis(0)),
        Err(ReplyError::OtherKind { .. })
    ));
    assert!(reply(end, words, UnixMillis(0)).is_ok());
}

#[test]
fn calls_that_ask_are_put_to_the_person_one_after_the_other() {
    let catalog = asking_catalog();
    let script = vec![
        tools(vec![
            call("a1", "ask", "{}"),
            call("a2", "ask", r#"{"n":2}"#),
        ]),
        final_answer("done"),
    ];
    let run = drive_with_humans(
        limits(),
        Arc::clone(&catalog),
        world(script),
        Vec::new(),
        &[true, true],
    );
    assert_eq!(run.outcome.reason, TerminalReason::Completed);
    let asked: Vec<&str> = run
        .log
        .iter()
        .filter_map(|event| match &event.body {
            EventBody::Ended(end) => end.input.as_deref().map(|i| i.call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(asked, ["a1", "a2"]);
    let ids: Vec<&str> = run.executed.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(
        ids,
        ["a2", "a1", "a1", "a2"],
        "each sent once more, when answered"
    );
    assert_eq!(run.outcome.totals.tool_calls, 2);
    assert_eq!(
        turns(&run.log).iter().map(|t| t.turn).collect::<Vec<_>>(),
        [1, 1, 1, 2]
    );
}

#[test]
fn a_write_that_asks_is_resumed_after_a_crash_with_its_answer() {
    let catalog = asking_catalog();
    let script = vec![
        tools(vec![
            lookup("l1", "profile"),
            call("w1", "ask_write", r#"{"to":"acct-1"}"#),
        ]),
        final_answer("done"),
    ];
    let waiting = drive(
        Invocation::new(limits(), Arc::clone(&catalog)),
        world(script.clone()),
    );
    let log = answered_with(&waiting.log, accept(r#"{"answer":"yes"}"#));
    let answer_seq = log.len() as u64;
    let mut restored = Invocation::restore(limits(), Arc::clone(&catalog), &log).unwrap();
    // The reopened write batch commits its start again; the worker dies after it.
    let actions = restored.step(Input::Start, UnixMillis(0)).unwrap();
    let [Action::Authorize { calls, .. }] = &actions[..] else {
        panic!("policy checks the calls again: {actions:?}")
    };
    assert_eq!(calls.len(), 2);
    let actions = restored
        .step(Input::Authorized(Verdict::Allow.into()), UnixMillis(0))
        .unwrap();
    let [Action::Commit { events, .. }] = &actions[..] else {
        panic!("the start is committed: {actions:?}")
    };
    assert!(matches!(
        &events[..],
        [Event { body: EventBody::BatchStarted(record), .. }] if record.turn == 1
    ));
    let mut log = log;
    log.extend(events.iter().cloned());

    // Another worker takes over: it sends the write again with the same answer, alone.
    let taken = Invocation::restore(limits(), Arc::clone(&catalog), &log).unwrap();
    let run = drive_from(taken, world(script), log);
    assert_eq!(run.outcome.reason, TerminalReason::Completed);
    let ids: Vec<&str> = run.executed.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, ["w1"]);
    let answers: Vec<u64> = run
        .actions
        .iter()
        .filter_map(|action| match action {
            Action::Execute { answer, .. } => answer.as_deref().map(|a| a.seq),
            _ => None,
        })
        .collect();
    assert_eq!(answers, [answer_seq]);
    let reopened = turns(&run.log)[1];
    assert!(matches!(
        reopened.results[0].outcome,
        CallOutcome::Output { .. }
    ));
    assert_eq!(
        reopened.results[1].outcome,
        output(r#"{"action":"accept","content":{"answer":"yes"}}"#)
    );
}

#[test]
fn a_cancel_while_the_answered_call_runs_keeps_the_other_results() {
    let catalog = asking_catalog();
    let waiting = drive(
        Invocation::new(limits(), Arc::clone(&catalog)),
        world(ask_and_lookup()),
    );
    let log = answered_with(&waiting.log, accept(r#"{"answer":"x"}"#));
    let mut invocation = Invocation::restore(limits(), catalog, &log).unwrap();
    invocation.step(Input::Start, UnixMillis(0)).unwrap();
    let actions = invocation
        .step(Input::Authorized(Verdict::Allow.into()), UnixMillis(0))
        .unwrap();
    assert!(matches!(&actions[..], [Action::Execute { calls, .. }] if calls.len() == 1));
    let actions = invocation
        .step(
            Input::Cancel {
                reason: String::new(),
            },
            UnixMillis(0),
        )
        .unwrap();
    assert!(matches!(&actions[..], [Action::CancelCalls { turn: 1 }]));
    let actions = invocation
        .step(
            Input::CallFinished {
                call_id: CallId::new("a1"),
                outcome: CallOutcome::Cancelled,
            },
            UnixMillis(0),
        )
        .unwrap();
    let [Action::Commit { events, .. }] = &actions[..] else {
        panic!("the turn and the end are committed: {actions:?}")
    };
    let [
        Event {
            body: EventBody::Turn(record),
            ..
        },
        Event {
            body: EventBody::Ended(end),
            ..
        },
    ] = &events[..]
    else {
        panic!("a turn and an end: {events:?}")
    };
    assert_eq!(end.reason, TerminalReason::Cancelled);
    assert!(matches!(
        record.results[0].outcome,
        CallOutcome::Output { .. }
    ));
    assert_eq!(record.results[1].outcome, CallOutcome::Cancelled);
}

#[test]
fn a_gated_call_that_asks_is_sent_again_under_its_approval() {
    let catalog = asking_catalog();
    let mut world = world(vec![
        tools(vec![call("w1", "ask_write", r#"{"to":"acct-1"}"#)]),
        final_answer("done"),
    ]);
    // Policy gates the write: a human must approve it, and did.
    world.policy = Box::new(|_| Verdict::RequireApproval {
        reason: "a write".into(),
    });
    let run = drive_with_humans(
        limits(),
        Arc::clone(&catalog),
        world,
        Vec::new(),
        &[true, true],
    );
    assert_eq!(
        run.outcome.reason,
        TerminalReason::Completed,
        "{:?}",
        run.log
    );
    let ids: Vec<&str> = run.executed.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, ["w1", "w1"], "sent once approved, once answered");
    let reopened = turns(&run.log)
        .into_iter()
        .rev()
        .find(|t| t.turn == 1)
        .unwrap();
    assert_eq!(
        reopened.results[0].outcome,
        output(r#"{"action":"accept","content":{"answer":"yes"}}"#)
    );

    // Without an approval, a call gated since it asked is not sent with the answer.
    let world = self::world(vec![
        tools(vec![call("w1", "ask_write", r#"{"to":"acct-1"}"#)]),
        final_answer("done"),
    ]);
    let waiting = drive(Invocation::new(limits(), Arc::clone(&catalog)), world);
    assert_eq!(
        waiting.outcome.reason,
        TerminalReason::ClarificationRequired
    );
    let log = answered_with(&waiting.log, accept(r#"{"answer":"yes"}"#));
    let restored = Invocation::restore(limits(), Arc::clone(&catalog), &log).unwrap();
    let mut world = self::world(vec![final_answer("done")]);
    world.policy = Box::new(|_| Verdict::RequireApproval {
        reason: "a write".into(),
    });
    let run = drive_from(restored, world, log);
    assert!(run.executed.is_empty(), "not sent: {:?}", run.executed);
    let reopened = turns(&run.log)[1];
    assert!(
        matches!(&reopened.results[0].outcome, CallOutcome::Error(e) if e.error_type == ErrorType::PermissionDenied),
        "{:?}",
        reopened.results[0]
    );
}
