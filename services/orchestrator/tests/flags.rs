//! `agentloop-orchestrator` refuses to start (exit 78, the key named) with an `[auth]` it
//! cannot use, and on a public address without authentication unless told
//! `--insecure-no-auth`. The binary itself, with a clean environment.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

fn orchestrator(dir: &Path, config: &str, args: &[&str]) -> Output {
    let file = dir.join("orchestrator.toml");
    std::fs::write(&file, config).unwrap();
    Command::new(env!("CARGO_BIN_EXE_agentloop-orchestrator"))
        .env_clear()
        .current_dir(dir)
        .arg("--config")
        .arg(&file)
        .args(["--data-dir", "data"])
        .args(args)
        .output()
        .unwrap()
}

fn refused(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("agentloop-orchestrator: bad configuration: "),
        "{stderr}"
    );
    stderr
}

const JWT: &str =
    "[auth]\nmode = \"jwt\"\nissuer = \"https://id.test\"\naudience = \"agentloop\"\n";

#[test]
fn an_auth_it_cannot_use_refuses_to_start_and_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // No key source.
    let stderr = refused(&orchestrator(dir, JWT, &["--dump-config"]));
    let local: &[&str] = &["--listen", "127.0.0.1:0"];
    assert!(stderr.contains("auth."), "{stderr}");
    // A secret file that is not there.
    let missing = format!("{JWT}hs256_secret_file = \"absent.secret\"\n");
    let stderr = refused(&orchestrator(dir, &missing, local));
    assert!(stderr.contains("auth.hs256_secret_file"), "{stderr}");
    assert!(stderr.contains("absent.secret"), "{stderr}");
    // A secret too short to be one: named, never printed.
    std::fs::write(dir.join("short.secret"), "tiny-secret").unwrap();
    let short = format!("{JWT}hs256_secret_file = \"short.secret\"\n");
    let stderr = refused(&orchestrator(dir, &short, local));
    assert!(stderr.contains("auth.hs256_secret_file"), "{stderr}");
    assert!(!stderr.contains("tiny-secret"), "{stderr}");
    // A JWKS file that is not a key set.
    std::fs::write(dir.join("keys.json"), "{\"keys\": 7}").unwrap();
    let jwks = format!("{JWT}jwks_file = \"keys.json\"\n");
    let stderr = refused(&orchestrator(dir, &jwks, local));
    assert!(stderr.contains("auth.jwks_file"), "{stderr}");
    // An unknown key.
    let stderr = refused(&orchestrator(dir, "[auth]\nmode = \"kerberos\"\n", local));
    assert!(stderr.contains("mode"), "{stderr}");
}

#[test]
fn a_public_address_needs_authentication_or_the_operators_leave() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let public = ["--listen", "0.0.0.0:0", "--dump-config"];
    // `--dump-config` runs every check before it prints, so nothing listens here.
    let stderr = refused(&orchestrator(dir, "", &public));
    assert!(stderr.contains("--insecure-no-auth"), "{stderr}");
    let allowed = orchestrator(
        dir,
        "",
        &[
            "--listen",
            "0.0.0.0:0",
            "--dump-config",
            "--insecure-no-auth",
        ],
    );
    assert_eq!(
        allowed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&allowed.stderr)
    );
    let dumped = String::from_utf8(allowed.stdout).unwrap();
    assert!(dumped.contains("insecure_no_auth = true"), "{dumped}");
    std::fs::write(dir.join("jwt.secret"), "s".repeat(48)).unwrap();
    let with_auth = format!("{JWT}hs256_secret_file = \"jwt.secret\"\n");
    let authenticated = orchestrator(dir, &with_auth, &public);
    assert_eq!(
        authenticated.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&authenticated.stderr)
    );
}
