//! The README's worked example, with the real binary: `agentloop dev --config` with
//! `[auth]`, a token from `agentloop token`, and `run --server` with and without it; and
//! `dev` refusing a public port without authentication.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Output;

use common::{agentloop, dev};

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Writes `orchestrator.toml`, an orchestrator configuration with `[auth]` over HS256
/// tokens signed with `jwt.secret` (written beside it), into `dir`.
fn with_auth(dir: &std::path::Path) {
    std::fs::write(dir.join("jwt.secret"), "s".repeat(48)).unwrap();
    std::fs::write(
        dir.join("orchestrator.toml"),
        "[auth]\nmode = \"jwt\"\nhs256_secret_file = \"jwt.secret\"\n\
         issuer = \"https://id.example\"\naudience = \"agentloop\"\n",
    )
    .unwrap();
}

#[test]
fn dev_with_auth_serves_only_callers_with_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    with_auth(dir);
    std::fs::write(
        dir.join("hello.json"),
        r#"{"turns": [{"final": "the profile is active"}]}"#,
    )
    .unwrap();
    let (_dev, endpoint) = dev(dir, &["--config", "orchestrator.toml"]);

    let run = |token: Option<&str>| {
        let mut command = agentloop(dir);
        command.args([
            "run",
            "--script",
            "hello.json",
            "--server",
            &endpoint,
            "--json",
        ]);
        if let Some(token) = token {
            command.env("AGENTLOOP_TOKEN", token);
        }
        command.output().unwrap()
    };
    let refused = run(None);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("Unauthenticated"),
        "{}",
        stderr(&refused)
    );

    let minted = agentloop(dir)
        .args([
            "token",
            "--secret-file",
            "jwt.secret",
            "--issuer",
            "https://id.example",
        ])
        .args(["--actor", "alice", "--tenant", "acme"])
        .output()
        .unwrap();
    assert_eq!(minted.status.code(), Some(0), "{}", stderr(&minted));
    let token = String::from_utf8(minted.stdout).unwrap();
    let accepted = run(Some(token.trim()));
    assert_eq!(accepted.status.code(), Some(0), "{}", stderr(&accepted));
    let summary: serde_json::Value = serde_json::from_slice(&accepted.stdout).unwrap();
    assert_eq!(summary["reason"], "completed");

    // A token signed with another secret is refused like none.
    std::fs::write(dir.join("other.secret"), "o".repeat(48)).unwrap();
    let forged = agentloop(dir)
        .args([
            "token",
            "--secret-file",
            "other.secret",
            "--issuer",
            "https://id.example",
        ])
        .args(["--actor", "alice", "--tenant", "acme"])
        .output()
        .unwrap();
    let forged = String::from_utf8(forged.stdout).unwrap();
    let refused = run(Some(forged.trim()));
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("Unauthenticated"),
        "{}",
        stderr(&refused)
    );
}

#[test]
fn dev_refuses_a_public_port_without_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let output = agentloop(dir.path())
        .args([
            "--data-dir",
            "data",
            "dev",
            "--listen",
            "0.0.0.0:0",
            "--http",
            "off",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(78), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("--insecure-no-auth"),
        "{}",
        stderr(&output)
    );
    // A bad [auth] is the operator's to fix too.
    std::fs::write(dir.path().join("bad.toml"), "[auth]\nmode = \"jwt\"\n").unwrap();
    let output = agentloop(dir.path())
        .args([
            "--data-dir",
            "data",
            "dev",
            "--config",
            "bad.toml",
            "--http",
            "off",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(78), "{}", stderr(&output));
    assert!(stderr(&output).contains("auth."), "{}", stderr(&output));
}

/// The embedded orchestrator reads `[auth]` as `dev` does: `run --config` and the reply
/// that resumes the invocation (through `AGENTLOOP_ORCHESTRATOR_CONFIG`) verify the
/// caller's token, and only an approver's resolves the approval.
#[test]
fn an_embedded_run_and_its_reply_verify_tokens_when_the_configuration_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    with_auth(dir);
    std::fs::write(
        dir.join("refund.json"),
        r#"{"turns": [
          {"request_approval": {"summary": "Refund 40.00", "calls": [{"id": "t1",
            "name": "transfer", "arguments": {"from": "acct-ops", "to": "acct-1", "amount": 4000}}]}},
          {"final": "refunded 40.00 to acct-1", "evidence": ["t1"]}]}"#,
    )
    .unwrap();
    let mint = |actor: &str, roles: &[&str]| {
        let mut command = agentloop(dir);
        command
            .args(["token", "--secret-file", "jwt.secret"])
            .args(["--issuer", "https://id.example", "--tenant", "acme"])
            .args(["--actor", actor]);
        for role in roles {
            command.args(["--role", role]);
        }
        let minted = command.output().unwrap();
        assert_eq!(minted.status.code(), Some(0), "{}", stderr(&minted));
        String::from_utf8(minted.stdout).unwrap().trim().to_owned()
    };
    let (alice, bob) = (mint("alice", &[]), mint("bob", &["approver"]));
    let embedded = |args: &[&str], token: Option<&str>| {
        let mut command = agentloop(dir);
        command
            .args(["--data-dir", "data"])
            .args(args)
            .env("AGENTLOOP_ORCHESTRATOR_CONFIG", "orchestrator.toml");
        if let Some(token) = token {
            command.env("AGENTLOOP_TOKEN", token);
        }
        command.output().unwrap()
    };
    let run = [
        "run",
        "--config",
        "orchestrator.toml",
        "--script",
        "refund.json",
    ];
    let run: Vec<&str> = run
        .into_iter()
        .chain(["--on-wait", "exit", "--json"])
        .collect();

    let refused = embedded(&run, None);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("Unauthenticated"),
        "{}",
        stderr(&refused)
    );

    let waiting = embedded(&run, Some(&alice));
    assert_eq!(waiting.status.code(), Some(10), "{}", stderr(&waiting));
    let summary: serde_json::Value = serde_json::from_slice(&waiting.stdout).unwrap();
    assert_eq!(summary["reason"], "approval_required");
    let id = summary["invocation_id"].as_str().unwrap().to_owned();
    let digest = summary["waiting"]["proposal_digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let approve = ["approve", &id, "--digest", &digest, "--yes", "--json"];

    let not_an_approver = embedded(&approve, Some(&alice));
    assert_eq!(
        not_an_approver.status.code(),
        Some(1),
        "{}",
        stderr(&not_an_approver)
    );
    assert!(
        stderr(&not_an_approver).contains("PermissionDenied"),
        "{}",
        stderr(&not_an_approver)
    );
    let approved = embedded(&approve, Some(&bob));
    assert_eq!(approved.status.code(), Some(0), "{}", stderr(&approved));
    let summary: serde_json::Value = serde_json::from_slice(&approved.stdout).unwrap();
    assert_eq!(summary["reason"], "completed");
}
