//! Authorization in the policy service: each call put to the profile's Cedar policies,
//! refusals per call with the deciding policies, approvals by amount, reloads.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agentloop_policy::{PolicyConfig, PolicyError, PolicyServer, ProfilePolicies};
use agentloop_proto::v1::{
    ErrorType, EvaluateRequest, EvaluateResponse, ToolCall, ToolDescriptor, Verdict,
};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn descriptors() -> Vec<ToolDescriptor> {
    agentloop_registry::ToolsConfig::load(&repo("deploy/tools.example.toml"))
        .unwrap()
        .descriptors()
}

fn server(policies: &[(&str, Vec<PathBuf>)]) -> Result<PolicyServer, PolicyError> {
    let config = PolicyConfig {
        policies: policies
            .iter()
            .map(|(profile, files)| ((*profile).to_owned(), files.clone()))
            .collect::<BTreeMap<_, _>>(),
        ..PolicyConfig::default()
    };
    PolicyServer::from_descriptors(&descriptors(), &config)
}

fn demo() -> PolicyServer {
    server(&[("default", vec![repo("deploy/policies/demo.cedar")])]).unwrap()
}

fn transfer(id: &str, from: &str, amount: u64) -> ToolCall {
    ToolCall {
        call_id: id.into(),
        tool: "transfer".into(),
        arguments_json: format!(r#"{{"from":"{from}","to":"b","amount":{amount}}}"#),
    }
}

fn lookup(id: &str) -> ToolCall {
    ToolCall {
        call_id: id.into(),
        tool: "lookup".into(),
        arguments_json: r#"{"key":"profile"}"#.into(),
    }
}

fn request(roles: &[&str], calls: Vec<ToolCall>) -> EvaluateRequest {
    EvaluateRequest {
        invocation_id: "inv-1".into(),
        turn: 1,
        profile: "default".into(),
        calls,
        actor: "ana".into(),
        tenant: "acme".into(),
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        approved_proposal_digest: String::new(),
    }
}

fn evaluate(server: &PolicyServer, request: &EvaluateRequest) -> EvaluateResponse {
    server.evaluate(request.clone()).unwrap()
}

#[test]
fn each_refused_call_is_named_with_its_policies_and_the_set_version() {
    let server = demo();
    let response = evaluate(
        &server,
        &request(
            &["clerk"],
            vec![
                lookup("l1"),
                transfer("t1", "reserve", 5),
                transfer("t2", "a", 5),
            ],
        ),
    );
    assert_eq!(response.verdict(), Verdict::Deny);
    assert_eq!(response.violations.len(), 1, "{:?}", response.violations);
    let refused = &response.violations[0];
    assert_eq!(refused.call_id, "t1");
    assert_eq!(refused.error_type(), ErrorType::PermissionDenied);
    assert_eq!(refused.policy_ids, ["reserve-is-untouchable"]);
    assert!(refused.message.contains("reserve-is-untouchable"));
    assert!(
        !refused.message.contains("forbid"),
        "never the policy's text"
    );
    assert_eq!(response.policy_version.len(), 32);

    // Without the clerk role nothing permits a transfer: denied, no policy to name.
    let response = evaluate(&server, &request(&[], vec![transfer("t1", "a", 5)]));
    assert_eq!(response.verdict(), Verdict::Deny);
    assert!(response.violations[0].policy_ids.is_empty());
    assert!(response.violations[0].message.contains("no policy permits"));

    let allowed = evaluate(
        &server,
        &request(&["clerk"], vec![lookup("l1"), transfer("t2", "a", 10_000)]),
    );
    assert_eq!(allowed.verdict(), Verdict::Allow);
    assert_eq!(allowed.policy_version, response.policy_version);
}

#[test]
fn a_large_transfer_needs_an_approval_bound_to_its_digest() {
    let server = demo();
    let mut large = request(&["clerk"], vec![transfer("t1", "a", 20_000)]);
    let gated = evaluate(&server, &large);
    assert_eq!(gated.verdict(), Verdict::RequireApproval);
    assert!(
        gated.violations[0]
            .message
            .contains("large-transfers-need-approval")
    );
    assert_eq!(
        gated.violations[0].policy_ids,
        ["large-transfers-need-approval"]
    );
    assert!(!gated.proposal_digest.is_empty());

    large.approved_proposal_digest = gated.proposal_digest.clone();
    assert_eq!(evaluate(&server, &large).verdict(), Verdict::Allow);

    // Another digest approves nothing here.
    let mut other = request(&["clerk"], vec![transfer("t1", "a", 30_000)]);
    other.approved_proposal_digest = gated.proposal_digest;
    assert_eq!(
        evaluate(&server, &other).verdict(),
        Verdict::RequireApproval
    );

    // An approval does not outrank a forbid.
    let mut reserve = request(&["clerk"], vec![transfer("t1", "reserve", 20_000)]);
    reserve.approved_proposal_digest = evaluate(
        &server,
        &request(&["clerk"], vec![transfer("t1", "reserve", 20_000)]),
    )
    .proposal_digest;
    assert_eq!(evaluate(&server, &reserve).verdict(), Verdict::Deny);
}

#[test]
fn schema_violations_come_first_and_a_profile_without_policies_is_refused() {
    let server = demo();
    let bad = ToolCall {
        call_id: "t1".into(),
        tool: "transfer".into(),
        arguments_json: r#"{"from":"a"}"#.into(),
    };
    let response = evaluate(&server, &request(&["clerk"], vec![bad]));
    assert_eq!(response.verdict(), Verdict::Deny);
    assert!(
        response
            .violations
            .iter()
            .all(|v| v.error_type() == ErrorType::InvalidArguments)
    );

    let mut elsewhere = request(&["clerk"], vec![lookup("l1")]);
    elsewhere.profile = "payments".into();
    let response = evaluate(&server, &elsewhere);
    assert_eq!(response.verdict(), Verdict::Deny);
    assert!(
        response.violations[0]
            .message
            .contains("no policies are configured for profile \"payments\"")
    );
}

#[test]
fn a_policy_that_does_not_validate_refuses_to_load_with_its_id_and_position() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.cedar");
    std::fs::write(&file, "@id(\"by-department\")\npermit(principal, action, resource)\nwhen { principal.department == \"ops\" };\n").unwrap();
    let error = server(&[("default", vec![file])]).unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, PolicyError::Policies { .. }), "{text}");
    assert!(text.contains("bad.cedar:3:"), "{text}");
    assert!(text.contains("policy by-department"), "{text}");
    assert_eq!(
        tonic::Status::from(error).code(),
        tonic::Code::FailedPrecondition
    );
}

#[test]
fn a_reload_swaps_in_changed_files_and_a_bad_one_keeps_the_set_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.cedar");
    std::fs::write(
        &file,
        "@id(\"lookups\") permit(principal, action, resource == Agentloop::Tool::\"lookup\");",
    )
    .unwrap();
    let server = server(&[("default", vec![file.clone()])]).unwrap();
    let profiles = server.profiles();
    let before = profiles.versions()["default"].clone();
    assert!(!profiles.reload().unwrap(), "nothing changed");
    assert_eq!(
        evaluate(&server, &request(&[], vec![lookup("l1")])).verdict(),
        Verdict::Allow
    );

    std::fs::write(
        &file,
        "@id(\"nothing\") forbid(principal, action, resource);",
    )
    .unwrap();
    assert!(profiles.reload().unwrap());
    let after = profiles.versions()["default"].clone();
    assert_ne!(before, after);
    let denied = evaluate(&server, &request(&[], vec![lookup("l1")]));
    assert_eq!(denied.verdict(), Verdict::Deny);
    assert_eq!(denied.violations[0].policy_ids, ["nothing"]);
    assert_eq!(denied.policy_version, after);

    std::fs::write(
        &file,
        "permit(principal, action, resource) when { principal.nope };",
    )
    .unwrap();
    let refused = profiles.reload().unwrap_err();
    assert!(refused.to_string().contains("nope"), "{refused}");
    assert_eq!(
        profiles.versions()["default"],
        after,
        "the set in force stays"
    );
    assert!(matches!(profiles.get("default"), ProfilePolicies::On(_)));
}

/// A server for `file` whose watcher reads the files every `watch_ms` (0: SIGHUP only).
fn watched(file: &Path, watch_ms: u64) -> PolicyServer {
    let config = PolicyConfig {
        policies: BTreeMap::from([("default".to_owned(), vec![file.to_path_buf()])]),
        policy_watch_ms: watch_ms,
        ..PolicyConfig::default()
    };
    PolicyServer::from_descriptors(&descriptors(), &config).unwrap()
}

const LOOKUPS: &str =
    "@id(\"lookups\") permit(principal, action, resource == Agentloop::Tool::\"lookup\");";
const NOTHING: &str = "@id(\"nothing\") forbid(principal, action, resource);";

#[tokio::test]
async fn the_watcher_reloads_a_changed_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.cedar");
    std::fs::write(&file, LOOKUPS).unwrap();
    let server = watched(&file, 20);
    let mut swaps = server.profiles().swaps();
    let _watcher = tokio::spawn(server.watch(false));

    std::fs::write(&file, NOTHING).unwrap();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        swaps.wait_for(|n| *n >= 1),
    )
    .await
    .expect("the change is loaded")
    .unwrap();
    let denied = evaluate(&server, &request(&[], vec![lookup("l1")]));
    assert_eq!(denied.violations[0].policy_ids, ["nothing"]);
}

#[tokio::test]
async fn sighup_reloads_the_policies() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.cedar");
    std::fs::write(&file, LOOKUPS).unwrap();
    // No polling: only the signal reloads.
    let server = watched(&file, 0);
    let mut swaps = server.profiles().swaps();
    // A listener of this test's own first: with one installed, a SIGHUP sent before the
    // watcher listens cannot end the test process.
    let _guard = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).unwrap();
    let watcher = tokio::spawn(server.watch(true));
    std::fs::write(&file, NOTHING).unwrap();
    // The handler is installed once the watcher first runs; signal until a swap is seen.
    let signalled = async {
        loop {
            let sent = std::process::Command::new("kill")
                .args(["-HUP", &std::process::id().to_string()])
                .status()
                .unwrap();
            assert!(sent.success());
            if tokio::time::timeout(
                std::time::Duration::from_millis(200),
                swaps.wait_for(|n| *n >= 1),
            )
            .await
            .is_ok()
            {
                return;
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), signalled)
        .await
        .expect("SIGHUP reloads");
    assert_eq!(
        evaluate(&server, &request(&[], vec![lookup("l1")])).verdict(),
        Verdict::Deny
    );
    watcher.abort();
}
