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

#[test]
fn dev_with_auth_serves_only_callers_with_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("jwt.secret"), "s".repeat(48)).unwrap();
    std::fs::write(
        dir.join("orchestrator.toml"),
        "[auth]\nmode = \"jwt\"\nhs256_secret_file = \"jwt.secret\"\n\
         issuer = \"https://id.example\"\naudience = \"agentloop\"\n",
    )
    .unwrap();
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
        .args(["--data-dir", "data", "dev", "--listen", "0.0.0.0:0"])
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
        .args(["--data-dir", "data", "dev", "--config", "bad.toml"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(78), "{}", stderr(&output));
    assert!(stderr(&output).contains("auth."), "{}", stderr(&output));
}
