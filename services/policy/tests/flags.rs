//! `agentloop-policy --dump-config` refuses what the service would refuse before it
//! needs the network: a configuration with no tool source, or with two.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};

fn policy(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop-policy"))
        .env_clear()
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn dump_config_checks_the_tool_source() {
    let none = policy(&["--dump-config"]);
    let stderr = String::from_utf8(none.stderr).unwrap();
    assert_eq!(none.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.starts_with("agentloop-policy: bad configuration: "),
        "{stderr}"
    );
    assert!(none.stdout.is_empty());

    let both = policy(&[
        "--dump-config",
        "--tools-file",
        "tools.toml",
        "--tools-endpoint",
        "http://127.0.0.1:1",
    ]);
    assert_eq!(both.status.code(), Some(78));
    assert!(both.stdout.is_empty());

    // One source: the effective configuration, without reading the file or dialling.
    let one = policy(&["--dump-config", "--tools-endpoint", "http://127.0.0.1:1"]);
    let stdout = String::from_utf8(one.stdout).unwrap();
    assert_eq!(
        one.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    let dumped: toml::Table = stdout.parse().unwrap();
    assert_eq!(
        dumped["tools_endpoint"].as_str(),
        Some("http://127.0.0.1:1")
    );
}

#[test]
fn a_policy_that_does_not_validate_exits_78_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let policy_file = dir.path().join("bad.cedar");
    std::fs::write(
        &policy_file,
        "@id(\"by-department\")\npermit(principal, action, resource)\nwhen { principal.department == \"ops\" };\n",
    )
    .unwrap();
    let config = dir.path().join("policy.toml");
    let tools = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/tools.example.toml"
    );
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ntools_file = {tools:?}\n[policies]\ndefault = [{:?}]\n",
            policy_file.display().to_string()
        ),
    )
    .unwrap();
    let output = policy(&["--config", config.to_str().unwrap()]);
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("bad.cedar:3:"), "{stderr}");
    assert!(stderr.contains("policy by-department"), "{stderr}");
}
