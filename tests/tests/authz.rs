//! Authorization of every tool call, end to end, in both wirings, under the example
//! policies of `deploy/policies/demo.cedar`: a refused call never reaches the executor
//! and the model reads why (the deciding policy's ID); repeated refusals end
//! `invalid_decision` naming the policy; a large transfer waits for a human and runs
//! once approved; a permission removed by a reload between the approval and the
//! dispatch stops the write; with authentication, the roles are the token's.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agentloop_auth::testing::{Alg, TokenIssuer};
use agentloop_e2e::*;
use agentloop_orchestrator::OrchestratorConfig;
use agentloop_policy::PolicyConfig;
use agentloop_proto::v1 as pb;
use tonic::Code;

both_wirings!(
    a_refused_call_never_runs_and_repeated_refusals_end_naming_the_policy,
    a_small_transfer_runs_and_a_large_one_waits_for_a_human,
    a_permission_removed_between_approval_and_dispatch_stops_the_write,
    with_authentication_the_roles_are_the_tokens,
);

fn demo_policies() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/policies/demo.cedar")
}

/// agentloop with `file` as the default profile's policies.
async fn under(wiring: Wiring, config: OrchestratorConfig, file: PathBuf) -> System {
    System::start_with(wiring, config, |services| {
        services.policy = PolicyConfig {
            policies: BTreeMap::from([("default".to_owned(), vec![file])]),
            ..PolicyConfig::default()
        };
    })
    .await
}

fn transfer_script(from: &str, amount: u64, times: usize) -> String {
    let turn = format!(
        r#"{{"tool_calls": [{{"id": "t1", "name": "transfer", "arguments": {{"from": "{from}", "to": "bob", "amount": {amount}}}}}]}}"#
    );
    let mut turns = vec![turn; times];
    turns.push(r#"{"final": "moved"}"#.to_owned());
    format!(r#"{{"turns": [{}]}}"#, turns.join(", "))
}

fn as_clerk(script: &str) -> pb::StartInvocationRequest {
    pb::StartInvocationRequest {
        actor: "ana".into(),
        tenant: "acme".into(),
        roles: vec!["clerk".into()],
        ..start_request(script)
    }
}

async fn a_refused_call_never_runs_and_repeated_refusals_end_naming_the_policy(wiring: Wiring) {
    let mut config = OrchestratorConfig::default();
    config.limits.decision_repairs = 1;
    let system = under(wiring, config, demo_policies()).await;
    let mut client = system.client().await;
    let (ended, events) =
        run_to_end(&mut client, as_clerk(&transfer_script("reserve", 500, 5))).await;
    assert_eq!(reason(&ended), pb::TerminalReason::InvalidDecision);
    assert!(
        ended.terminal_detail.contains("reserve-is-untouchable"),
        "{}",
        ended.terminal_detail
    );
    assert!(
        !ended.terminal_detail.contains("forbid"),
        "the policy's ID, never its text"
    );
    let turns = turns(&events);
    assert_eq!(turns.len(), 2, "one repair turn, then the end: {turns:?}");
    for turn in &turns {
        assert!(turn.results.is_empty(), "nothing ran");
        assert_eq!(
            turn.policy_version.len(),
            32,
            "the judging set's version is recorded"
        );
        let rejection = turn.rejection.as_ref().unwrap();
        assert_eq!(rejection.refusals.len(), 1);
        let refusal = &rejection.refusals[0];
        assert_eq!(refusal.call_id, "t1");
        assert_eq!(refusal.error_type(), pb::ErrorType::PermissionDenied);
        assert_eq!(refusal.policy_ids, ["reserve-is-untouchable"]);
    }
    assert_eq!(system.executor().stats().applied, 0);

    // Without the clerk role, no policy permits a transfer at all.
    let mut request = as_clerk(&transfer_script("alice", 500, 5));
    request.roles.clear();
    let (ended, _) = run_to_end(&mut client, request).await;
    assert_eq!(reason(&ended), pb::TerminalReason::InvalidDecision);
    assert!(
        ended.terminal_detail.contains("no policy permits"),
        "{}",
        ended.terminal_detail
    );
    system.stop().await;
}

async fn a_small_transfer_runs_and_a_large_one_waits_for_a_human(wiring: Wiring) {
    let system = under(wiring, OrchestratorConfig::default(), demo_policies()).await;
    let mut client = system.client().await;
    let (ended, events) =
        run_to_end(&mut client, as_clerk(&transfer_script("alice", 10_000, 1))).await;
    assert_eq!(reason(&ended), pb::TerminalReason::Completed);
    assert_eq!(
        applied_for(system.executor(), &ended.invocation_id).len(),
        1
    );
    // The turn that ran the transfer names the policy that permitted it.
    let ran = turns(&events)
        .into_iter()
        .find(|t| !t.results.is_empty())
        .unwrap();
    let permits: Vec<(&str, &[String])> = ran
        .permits
        .iter()
        .map(|p| (p.call_id.as_str(), p.policy_ids.as_slice()))
        .collect();
    assert_eq!(
        permits,
        [("t1", &["small-transfers-for-clerks".to_owned()][..])]
    );

    let (id, _, end) =
        start_waiting(&mut client, as_clerk(&transfer_script("alice", 20_000, 1))).await;
    assert_eq!(end.reason(), pb::TerminalReason::ApprovalRequired);
    assert!(
        end.detail.contains("large-transfers-need-approval"),
        "{}",
        end.detail
    );
    assert!(
        applied_for(system.executor(), &id).is_empty(),
        "nothing runs before the approval"
    );
    approve(&mut client, &id, &end.proposal_digest)
        .await
        .unwrap();
    let events = events_until_final_end(&mut client, &id).await;
    assert_eq!(
        reason(&get(&mut client, &id).await),
        pb::TerminalReason::Completed
    );
    let applied = applied_for(system.executor(), &id);
    assert_eq!(applied.len(), 1, "applied once, after the approval");
    assert_eq!(applied[0].amount, 20_000);
    // The reopened turn was judged again, with the approval.
    let reopened = turns(&events)
        .into_iter()
        .find(|t| !t.results.is_empty())
        .unwrap();
    assert!(!reopened.policy_version.is_empty());
    assert_eq!(reopened.permits.len(), 1);
    assert_eq!(
        reopened.permits[0].policy_ids,
        ["large-transfers-need-approval"],
        "the approval permit granted it, once approved"
    );
    system.stop().await;
}

async fn a_permission_removed_between_approval_and_dispatch_stops_the_write(wiring: Wiring) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policies.cedar");
    let demo = std::fs::read_to_string(demo_policies()).unwrap();
    std::fs::write(&file, &demo).unwrap();
    let system = under(wiring, OrchestratorConfig::default(), file.clone()).await;
    let mut client = system.client().await;
    // The model answers "moved" whatever happened, twice.
    let script = transfer_script("alice", 20_000, 1).replace(
        r#"{"final": "moved"}"#,
        r#"{"final": "moved"}, {"final": "moved"}"#,
    );
    let (id, events, end) = start_waiting(&mut client, as_clerk(&script)).await;
    let judged_first = turns(&events)[0].policy_version.clone();

    // Transfers are frozen while the approval is pending.
    let frozen = format!(
        "{demo}\n@id(\"transfers-frozen\")\nforbid(principal, action, resource == Agentloop::Tool::\"transfer\");\n"
    );
    std::fs::write(&file, frozen).unwrap();
    assert!(
        system.stack().policies().reload().unwrap(),
        "the change is loaded"
    );

    approve(&mut client, &id, &end.proposal_digest)
        .await
        .unwrap();
    let events = events_until_final_end(&mut client, &id).await;
    assert!(
        applied_for(system.executor(), &id).is_empty(),
        "the write was never sent"
    );
    let reopened = turns(&events)
        .into_iter()
        .find(|t| !t.results.is_empty())
        .unwrap();
    let Some(pb::tool_result::Outcome::Error(error)) = &reopened.results[0].outcome else {
        panic!("expected the refusal as the result: {reopened:?}");
    };
    assert_eq!(error.error_type(), pb::ErrorType::PermissionDenied);
    assert!(
        error.message.contains("transfers-frozen"),
        "{}",
        error.message
    );
    assert_ne!(
        reopened.policy_version, judged_first,
        "judged by the policies in force then"
    );
    // The model hears of it, and its claim that the money moved does not get past the
    // ledger, which has the write rejected.
    let ended = get(&mut client, &id).await;
    assert_eq!(reason(&ended), pb::TerminalReason::VerificationFailed);
    assert!(
        ended
            .terminal_detail
            .contains("is rejected in the effect ledger"),
        "{}",
        ended.terminal_detail
    );
    if let Some(mut ledger) = system.ledger().await {
        let unresolved = ledger
            .list_unresolved(pb::ListUnresolvedRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(
            unresolved.entries.is_empty(),
            "the refused write is settled, not left pending"
        );
    }
    system.stop().await;
}

async fn with_authentication_the_roles_are_the_tokens(wiring: Wiring) {
    let issuer = TokenIssuer::new(Alg::Es256);
    let keys = tempfile::tempdir().unwrap();
    let mut config = OrchestratorConfig::default();
    config.server.auth = issuer.write_key_source(keys.path());
    let system = under(wiring, config, demo_policies()).await;
    let client_as = |token: String| {
        let endpoint = system.stack().endpoint();
        async move {
            agentloop_proto::client::orchestrator(
                agentloop_stack::channel_as(&endpoint, Some(&token))
                    .await
                    .unwrap(),
            )
        }
    };
    let mut clerk = client_as(issuer.token("ana", "acme", &["clerk"])).await;
    let (ended, _) = run_to_end(&mut clerk, start_request(&transfer_script("alice", 500, 1))).await;
    assert_eq!(reason(&ended), pb::TerminalReason::Completed);

    let mut plain = client_as(issuer.token("bo", "acme", &[])).await;
    let (ended, _) = run_to_end(&mut plain, start_request(&transfer_script("alice", 500, 5))).await;
    assert_eq!(reason(&ended), pb::TerminalReason::InvalidDecision);

    // A body cannot grant roles its token does not.
    let error = plain
        .start_invocation(pb::StartInvocationRequest {
            roles: vec!["clerk".into()],
            ..start_request(&transfer_script("alice", 500, 1))
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::PermissionDenied);
    system.stop().await;
}
