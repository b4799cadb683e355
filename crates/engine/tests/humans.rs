//! Waiting for a human and resuming after the reply: restored from a log that ends
//! waiting, then the reply's event, in every verdict.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use agentloop_engine::*;
use agentloop_testkit::*;

fn transfer() -> Vec<ProposedCall> {
    vec![call("t1", "transfer", r#"{"to":"acct-1","amount":40}"#)]
}

fn ask_approval() -> ProposedDecision {
    ProposedDecision::RequestApproval {
        summary: "refund 40 to acct-1".into(),
        calls: transfer(),
    }
}

fn last_end(log: &[Event]) -> &EndRecord {
    match &log.last().expect("a log").body {
        EventBody::Ended(end) => end,
        other => panic!("the log does not end with Ended: {other:?}"),
    }
}

fn limits() -> Limits {
    Limits {
        max_wait_ms: 60_000,
        ..Limits::default()
    }
}

/// The log of a run that stopped to wait, with `reply` committed after its end at `now`.
fn replied(log: &[Event], reply_with: Reply, now: UnixMillis) -> Vec<Event> {
    let body = reply(last_end(log), reply_with, now).unwrap();
    let mut log = log.to_vec();
    let seq = log.len() as u64 + 1;
    log.push(Event { seq, body });
    log
}

fn approve(end: &EndRecord, approved: bool) -> Reply {
    Reply::Resolve {
        proposal: end.proposal.unwrap(),
        approved,
        actor: "ana".into(),
        comment: if approved { "" } else { "not today" }.into(),
    }
}

#[test]
fn a_request_for_approval_waits_with_the_exact_proposal_and_a_bound() {
    let mut invocation = Invocation::new(limits(), catalog());
    let now = UnixMillis(1_000);
    invocation.step(Input::Start, now).unwrap();
    let actions = invocation
        .step(
            Input::Decided {
                decision: ask_approval(),
                usage: Usage::default(),
            },
            now,
        )
        .unwrap();
    // The proposal passes policy like any batch before a human sees it.
    let [Action::Authorize { approved: None, .. }] = actions.as_slice() else {
        panic!("expected an authorization, got {actions:?}")
    };
    let actions = invocation
        .step(Input::Authorized(Verdict::Allow.into()), now)
        .unwrap();
    let [Action::Commit { events, .. }] = actions.as_slice() else {
        panic!("expected a commit, got {actions:?}")
    };
    let EventBody::Ended(end) = &events[1].body else {
        panic!("expected the waiting end")
    };
    assert_eq!(end.reason, TerminalReason::ApprovalRequired);
    assert_eq!(end.detail, "refund 40 to acct-1");
    assert_eq!(
        end.wait,
        Some(Wait {
            since: now,
            until: UnixMillis(61_000)
        })
    );
    let Decision::RequestApproval { batch, .. } =
        validate(&ask_approval(), &catalog(), &DecisionBounds::default()).unwrap()
    else {
        panic!()
    };
    assert_eq!(end.proposal, Some(batch.fingerprint));
}

#[test]
fn an_approval_runs_exactly_the_approved_calls_once_then_asks_the_model_again() {
    let script = vec![ask_approval(), final_answer("refunded")];
    let waiting = drive(
        Invocation::new(limits(), catalog()),
        World::scripted(script.clone()),
    );
    assert_eq!(waiting.outcome.reason, TerminalReason::ApprovalRequired);
    assert!(
        waiting.executed.is_empty(),
        "nothing runs before a human says so"
    );

    let end = last_end(&waiting.log).clone();
    let log = replied(&waiting.log, approve(&end, true), UnixMillis(5_000));
    let restored = Invocation::restore(limits(), catalog(), &log).unwrap();
    assert_eq!(restored.phase_name(), "approved");
    assert_eq!(restored.protocol().waited_ms(), 5_000);

    // Policy sees the calls again at dispatch, with the approved digest.
    let mut world = World::scripted(script);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    world.policy = Box::new(move |calls| {
        record.lock().unwrap().push(calls.to_vec());
        Verdict::RequireApproval {
            reason: "transfers need a human".into(),
        }
    });
    let run = drive_from(restored, world, log.clone());
    assert_eq!(run.outcome.reason, TerminalReason::Completed);
    assert_eq!(run.executed.len(), 1, "the approved call ran once");
    assert_eq!(run.executed[0].call_id.as_str(), "t1");
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert!(run.actions.iter().any(|a| matches!(
        a,
        Action::Authorize { approved: Some(p), .. } if Some(*p) == end.proposal
    )));
    // The approved turn is committed again, with the results; the model's next turn is 2.
    let turn_numbers: Vec<u32> = turns(&run.log).iter().map(|t| t.turn).collect();
    assert_eq!(turn_numbers, vec![1, 1, 2]);
    let reopened = turns(&run.log)[1];
    assert_eq!(reopened.results.len(), 1);
    assert_eq!(reopened.usage, Usage::default());
    assert!(
        run.log
            .iter()
            .any(|e| matches!(e.body, EventBody::BatchStarted(ref r) if r.turn == 1)),
        "the write is started durably before it is sent"
    );
    assert_eq!(run.outcome.totals.steps, 2);
    assert_eq!(run.outcome.totals.tool_calls, 1);
    // The whole log restores to the same end.
    let again = Invocation::restore(limits(), catalog(), &run.log).unwrap();
    assert_eq!(again.outcome(), Some(&run.outcome));
}

#[test]
fn a_denial_runs_nothing_and_the_same_proposal_is_not_put_to_a_human_again() {
    let script = vec![ask_approval(), ask_approval(), final_answer("gave up")];
    let waiting = drive(
        Invocation::new(limits(), catalog()),
        World::scripted(script.clone()),
    );
    let end = last_end(&waiting.log).clone();
    let log = replied(&waiting.log, approve(&end, false), UnixMillis(0));
    let restored = Invocation::restore(limits(), catalog(), &log).unwrap();
    assert!(restored.protocol().was_denied(&end.proposal.unwrap()));
    let limits = Limits {
        decision_repairs: 1,
        ..limits()
    };
    let restored = Invocation::restore(limits, catalog(), &log).unwrap();
    let run = drive_from(restored, World::scripted(script), log);
    assert!(run.executed.is_empty());
    assert_eq!(run.outcome.reason, TerminalReason::Completed);
    let second = turns(&run.log)[1];
    assert_eq!(second.turn, 2);
    let rejection = second.rejection.as_ref().expect("the repeat is refused");
    assert_eq!(rejection.kind, RejectionKind::InvalidDecision);
    assert!(
        rejection.message.contains("denied"),
        "{}",
        rejection.message
    );
    assert!(
        !run.log[waiting.log.len() + 1..]
            .iter()
            .any(|e| matches!(&e.body, EventBody::Ended(end) if end.waits())),
        "not put to a human again"
    );
}

#[test]
fn a_policy_gate_waits_and_an_approval_satisfies_it_for_exactly_those_calls() {
    let script = vec![tools(transfer()), final_answer("done")];
    let mut world = World::scripted(script.clone());
    world.policy = Box::new(|_| Verdict::RequireApproval {
        reason: "transfers need a human".into(),
    });
    let waiting = drive(Invocation::new(limits(), catalog()), world);
    let end = last_end(&waiting.log).clone();
    assert_eq!(end.reason, TerminalReason::ApprovalRequired);
    assert_eq!(end.detail, "transfers need a human");
    assert!(end.waits());

    let log = replied(&waiting.log, approve(&end, true), UnixMillis(0));
    let mut world = World::scripted(script);
    world.policy = Box::new(|_| Verdict::RequireApproval {
        reason: "transfers need a human".into(),
    });
    let restored = Invocation::restore(limits(), catalog(), &log).unwrap();
    let run = drive_from(restored, world, log);
    assert_eq!(run.outcome.reason, TerminalReason::Completed);
    assert_eq!(run.executed.len(), 1);

    // Denied at dispatch: the approval does not outrank a policy that now says no. The
    // call is not sent; its result is the refusal, and the model goes on from there.
    let log = replied(&waiting.log, approve(&end, true), UnixMillis(0));
    let mut world = World::scripted(vec![tools(transfer()), final_answer("done")]);
    world.policy = Box::new(|_| Verdict::Deny {
        reason: "the account is frozen".into(),
        refusals: vec![Refusal {
            call_id: CallId::new("t1"),
            error_type: ErrorType::PermissionDenied,
            message: "permission denied by policy frozen-accounts".into(),
            policies: vec!["frozen-accounts".into()],
        }],
    });
    let restored = Invocation::restore(limits(), catalog(), &log).unwrap();
    let run = drive_from(restored, world, log);
    assert!(run.executed.is_empty());
    assert_eq!(run.outcome.reason, TerminalReason::Completed);
    let reopened = turns(&run.log)[1];
    match &reopened.results[0].outcome {
        CallOutcome::Error(error) => {
            assert_eq!(error.error_type, ErrorType::PermissionDenied);
            assert!(error.message.contains("frozen-accounts"), "{error:?}");
            assert!(!error.retryable);
        }
        other => panic!("expected the refusal as its result, got {other:?}"),
    }

    // A verdict that names no call refuses every call of the batch.
    let log = replied(&waiting.log, approve(&end, true), UnixMillis(0));
    let mut world = World::scripted(vec![tools(transfer()), final_answer("done")]);
    world.policy = Box::new(|_| Verdict::Deny {
        reason: "the policy service failed".into(),
        refusals: Vec::new(),
    });
    let restored = Invocation::restore(limits(), catalog(), &log).unwrap();
    let run = drive_from(restored, world, log);
    assert!(run.executed.is_empty());
    let reopened = turns(&run.log)[1];
    assert!(matches!(&reopened.results[0].outcome,
        CallOutcome::Error(e) if e.error_type == ErrorType::PermissionDenied && e.message.contains("service failed")));
}

#[test]
fn an_answered_question_resumes_with_the_next_turn() {
    let script = vec![
        ProposedDecision::Clarification {
            question: "which account?".into(),
        },
        final_answer("acct-1"),
    ];
    let waiting = drive(
        Invocation::new(limits(), catalog()),
        World::scripted(script.clone()),
    );
    let end = last_end(&waiting.log).clone();
    assert_eq!(end.reason, TerminalReason::ClarificationRequired);
    assert_eq!(end.detail, "which account?");
    assert!(end.waits());
    let answer = Reply::Answer {
        answer: "acct-1".into(),
        actor: "ana".into(),
        action: None,
    };
    let log = replied(&waiting.log, answer, UnixMillis(0));
    let restored = Invocation::restore(limits(), catalog(), &log).unwrap();
    let run = drive_from(restored, World::scripted(script), log);
    assert_eq!(run.outcome.reason, TerminalReason::Completed);
    assert_eq!(run.outcome.answer.as_deref(), Some("acct-1"));
    assert!(run.log.iter().any(|e| matches!(
        &e.body,
        EventBody::ClarificationAnswered(a) if a.answer == "acct-1" && a.actor == "ana"
    )));
}

#[test]
fn replies_that_do_not_fit_the_wait_are_refused() {
    let waiting = drive(
        Invocation::new(limits(), catalog()),
        World::scripted(vec![ask_approval()]),
    );
    let end = last_end(&waiting.log).clone();
    let wrong = Reply::Resolve {
        proposal: Fingerprint([7; 32]),
        approved: true,
        actor: "ana".into(),
        comment: String::new(),
    };
    assert!(matches!(
        reply(&end, wrong, UnixMillis(0)),
        Err(ReplyError::WrongProposal { .. })
    ));
    let answer = Reply::Answer {
        answer: "x".into(),
        actor: "ana".into(),
        action: None,
    };
    assert!(matches!(
        reply(&end, answer.clone(), UnixMillis(0)),
        Err(ReplyError::OtherKind { .. })
    ));
    let completed = drive(
        Invocation::new(limits(), catalog()),
        World::scripted(vec![final_answer("x")]),
    );
    assert_eq!(
        reply(last_end(&completed.log), answer, UnixMillis(0)),
        Err(ReplyError::NotWaiting)
    );
    assert_eq!(
        end_wait(
            last_end(&completed.log),
            WaitEnd::Cancelled(String::new()),
            UnixMillis(0)
        ),
        Err(ReplyError::NotWaiting)
    );

    // Restore refuses a reply where none fits: after a final end, for another
    // proposal, or a second reply to the same wait.
    let mut bad = completed.log.clone();
    bad.push(Event {
        seq: bad.len() as u64 + 1,
        body: reply(&end, approve(&end, true), UnixMillis(0)).unwrap(),
    });
    assert!(matches!(
        Invocation::restore(limits(), catalog(), &bad),
        Err(RestoreError::BadReply(..))
    ));
    let mut twice = replied(&waiting.log, approve(&end, false), UnixMillis(0));
    twice.push(Event {
        seq: twice.len() as u64 + 1,
        body: reply(&end, approve(&end, true), UnixMillis(0)).unwrap(),
    });
    assert!(matches!(
        Invocation::restore(limits(), catalog(), &twice),
        Err(RestoreError::BadReply(..))
    ));
    let mut turn_after_wait = waiting.log.clone();
    turn_after_wait.push(Event {
        seq: turn_after_wait.len() as u64 + 1,
        body: waiting.log[0].body.clone(),
    });
    assert!(matches!(
        Invocation::restore(limits(), catalog(), &turn_after_wait),
        Err(RestoreError::BadReply(..))
    ));
}

#[test]
fn a_wait_ends_for_good_when_cancelled_or_when_its_bound_passes() {
    let waiting = drive(
        Invocation::new(limits(), catalog()),
        World::scripted(vec![ask_approval()]),
    );
    let end = last_end(&waiting.log).clone();
    let until = end.wait.unwrap().until;

    let cancelled = end_wait(&end, WaitEnd::Cancelled("wrong customer".into()), until).unwrap();
    let EventBody::Ended(record) = &cancelled else {
        panic!()
    };
    assert_eq!(record.reason, TerminalReason::Cancelled);
    assert_eq!(record.detail, "wrong customer");
    assert!(!record.waits());
    let mut log = waiting.log.clone();
    log.push(Event {
        seq: log.len() as u64 + 1,
        body: cancelled,
    });
    let restored = Invocation::restore(limits(), catalog(), &log).unwrap();
    assert_eq!(
        restored.outcome().map(|o| o.reason),
        Some(TerminalReason::Cancelled)
    );
    // Nothing more after the final end, not even a reply.
    log.push(Event {
        seq: log.len() as u64 + 1,
        body: reply(&end, approve(&end, true), until).unwrap(),
    });
    assert!(Invocation::restore(limits(), catalog(), &log).is_err());

    assert_eq!(
        end_wait(&end, WaitEnd::Expired, UnixMillis(until.0 - 1)),
        Err(ReplyError::NotExpired(until))
    );
    let EventBody::Ended(expired) = end_wait(&end, WaitEnd::Expired, until).unwrap() else {
        panic!()
    };
    assert_eq!(expired.reason, TerminalReason::DeadlineExceeded);
    assert!(
        expired.detail.contains("an approval of proposal") && expired.detail.contains("60 s"),
        "{}",
        expired.detail
    );
}

#[test]
fn waiting_for_a_human_does_not_use_up_the_deadline_unless_configured() {
    for counts in [false, true] {
        let limits = Limits {
            deadline: Some(UnixMillis(10_000)),
            wait_counts_toward_deadline: counts,
            ..limits()
        };
        let waiting = drive(
            Invocation::new(limits, catalog()),
            World::scripted(vec![ProposedDecision::Clarification {
                question: "which account?".into(),
            }]),
        );
        // The clock of the test harness stands at 0; the reply comes 30 s later.
        let answer = Reply::Answer {
            answer: "acct-1".into(),
            actor: "ana".into(),
            action: None,
        };
        let log = replied(&waiting.log, answer, UnixMillis(30_000));
        let mut restored = Invocation::restore(limits, catalog(), &log).unwrap();
        let actions = restored.step(Input::Start, UnixMillis(30_000)).unwrap();
        if counts {
            assert_eq!(restored.deadline(), Some(UnixMillis(10_000)));
            let [Action::Commit { events, .. }] = actions.as_slice() else {
                panic!("{actions:?}")
            };
            assert!(matches!(
                &events[0].body,
                EventBody::Ended(end) if end.reason == TerminalReason::DeadlineExceeded
            ));
        } else {
            assert_eq!(restored.deadline(), Some(UnixMillis(40_000)));
            assert_eq!(actions, vec![Action::Decide { turn: 2 }]);
        }
    }
}

#[test]
fn a_cancel_records_its_reason_as_the_terminal_detail() {
    let mut invocation = Invocation::new(limits(), catalog());
    invocation.step(Input::Start, UnixMillis(0)).unwrap();
    let actions = invocation
        .step(
            Input::Cancel {
                reason: "the customer called back".into(),
            },
            UnixMillis(0),
        )
        .unwrap();
    let [Action::Commit { events, .. }] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert!(matches!(
        &events[0].body,
        EventBody::Ended(end) if end.reason == TerminalReason::Cancelled
            && end.detail == "the customer called back"
    ));
}
