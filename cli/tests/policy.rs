//! `agentloop policy` as a policy author runs it: validating files, checking calls
//! against the demo policies, printing the schema; output, `--json` and exit codes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::{Command, Output};

use common::{stderr, stdout};

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/policies/demo.cedar");

fn policy(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .arg("policy")
        .args(args)
        .env_remove("AGENTLOOP_TOKEN")
        .output()
        .unwrap()
}

/// `policy check` of the demo policies for actor ana of acme with `roles`.
fn check(roles: &str, tool: &str, arguments: &str, more: &[&str]) -> Output {
    let mut args = vec![
        "check",
        "--policies",
        DEMO,
        "--actor",
        "ana",
        "--tenant",
        "acme",
        "--tool",
        tool,
        "--args",
        arguments,
    ];
    if !roles.is_empty() {
        args.extend(["--roles", roles]);
    }
    args.extend(more);
    policy(&args)
}

#[test]
fn validate_accepts_the_demo_policies_and_prints_their_version() {
    let output = policy(&["validate", DEMO]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.starts_with("ok: 4 policies, version "), "{text}");
    let version = text.trim().rsplit(' ').next().unwrap();
    assert_eq!(version.len(), 32, "{text}");

    let output = policy(&["validate", "--json", DEMO]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let json: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(json["ok"], true);
    assert_eq!(json["version"], version);
    let ids: Vec<&str> = json["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "large-transfers-need-approval",
            "lookup-for-everyone",
            "reserve-is-untouchable",
            "small-transfers-for-clerks"
        ]
    );
}

#[test]
fn validate_names_the_file_position_and_policy_of_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.cedar");
    std::fs::write(
        &bad,
        "permit(principal, action, resource);\n@id(\"by-department\")\npermit(principal, action, resource)\n  when { principal.department == \"sales\" };\n",
    )
    .unwrap();
    let bad = bad.to_str().unwrap();

    let output = policy(&["validate", DEMO, bad]);
    assert_eq!(output.status.code(), Some(78), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.starts_with(&format!("{bad}:4:")), "{text}");
    assert!(text.contains(": policy by-department: "), "{text}");
    assert!(text.contains("department"), "{text}");

    let output = policy(&["validate", "--json", bad]);
    assert_eq!(output.status.code(), Some(78));
    let json: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(json["ok"], false);
    let problem = &json["problems"][0];
    assert_eq!(problem["file"], bad);
    assert_eq!(problem["line"], 4);
    assert!(problem["column"].as_u64().unwrap() >= 1, "{json}");
    assert_eq!(problem["policy"], "by-department");
    assert!(
        problem["detail"].as_str().unwrap().contains("department"),
        "{json}"
    );

    // A file that is not there does not load either.
    let missing = dir.path().join("missing.cedar");
    let output = policy(&["validate", "--json", missing.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(78));
    let json: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(json["problems"][0]["file"], missing.to_str().unwrap());
    assert_eq!(json["problems"][0]["line"], serde_json::Value::Null);
}

#[test]
fn check_prints_the_decision_and_the_deciding_policies() {
    let transfer =
        |from: &str, amount: u32| format!(r#"{{"from": "{from}", "to": "b", "amount": {amount}}}"#);
    let cases = [
        (
            "clerk",
            transfer("a", 5_000),
            0,
            "allow\npolicies: small-transfers-for-clerks\n",
        ),
        (
            "clerk",
            transfer("a", 20_000),
            3,
            "require_approval\npolicies: large-transfers-need-approval\n",
        ),
        (
            "clerk",
            transfer("reserve", 5_000),
            4,
            "deny\npolicies: reserve-is-untouchable\n",
        ),
        (
            "",
            transfer("a", 5_000),
            4,
            "deny\nno policy permits this call\n",
        ),
        (
            "auditor,clerk",
            transfer("a", 5_000),
            0,
            "allow\npolicies: small-transfers-for-clerks\n",
        ),
    ];
    for (roles, arguments, code, expected) in cases {
        let output = check(roles, "transfer", &arguments, &[]);
        assert_eq!(
            output.status.code(),
            Some(code),
            "{roles} {arguments}: {}",
            stderr(&output)
        );
        assert_eq!(stdout(&output), expected, "{roles} {arguments}");
    }
    // Repeated --roles is the same as a list.
    let output = check(
        "auditor",
        "transfer",
        &transfer("a", 5_000),
        &["--roles", "clerk"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn check_json_has_the_decision_policies_errors_and_version() {
    let output = check(
        "clerk",
        "transfer",
        r#"{"from": "a", "to": "b", "amount": 20000}"#,
        &["--json"],
    );
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let json: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(json["decision"], "require_approval");
    assert_eq!(
        json["policies"],
        serde_json::json!(["large-transfers-need-approval"])
    );
    assert_eq!(json["errors"], serde_json::json!([]));
    assert_eq!(json["version"].as_str().unwrap().len(), 32);

    let output = check("", "transfer", r#"{"amount": 1}"#, &["--json"]);
    assert_eq!(output.status.code(), Some(4));
    let json: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(json["decision"], "deny");
    assert_eq!(json["policies"], serde_json::json!([]));
}

#[test]
fn check_refuses_bad_usage_with_exit_code_2() {
    for arguments in ["[1]", "not json"] {
        let output = check("clerk", "transfer", arguments, &[]);
        assert_eq!(output.status.code(), Some(2), "{arguments}");
        assert!(stderr(&output).contains("--args"), "{}", stderr(&output));
        assert!(stdout(&output).is_empty());
    }
    let output = check("clerk", "nope", "{}", &[]);
    assert_eq!(output.status.code(), Some(2));
    let text = stderr(&output);
    assert!(
        text.contains("'nope'") && text.contains("lookup, sleep, transfer"),
        "{text}"
    );
}

#[test]
fn check_exits_78_when_the_policies_do_not_load() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.cedar");
    std::fs::write(
        &bad,
        "permit(principal, action, resource) when { context.colour };",
    )
    .unwrap();
    let output = policy(&[
        "check",
        "--policies",
        bad.to_str().unwrap(),
        "--actor",
        "ana",
        "--tenant",
        "acme",
        "--tool",
        "lookup",
        "--args",
        "{}",
    ]);
    assert_eq!(output.status.code(), Some(78));
    assert!(stderr(&output).contains("bad.cedar"), "{}", stderr(&output));
}

#[test]
fn schema_prints_the_entity_model_with_the_tools_arguments() {
    let output = policy(&["schema"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("namespace Agentloop"), "{text}");
    assert!(text.contains("type Arguments"), "{text}");
    assert!(text.contains(r#""amount"?: Long"#), "{text}");
}

#[test]
fn tools_names_the_registry_the_policies_are_for() {
    let tools = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/tools.example.toml");
    let output = policy(&["validate", "--tools", tools, DEMO]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

    // The example registry has no `sleep`: neither its tool nor its `ms` argument.
    let output = check("clerk", "sleep", r#"{"ms": 1}"#, &["--tools", tools]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("the tools are lookup, transfer"),
        "{}",
        stderr(&output)
    );
    let output = policy(&["schema", "--tools", tools]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!stdout(&output).contains(r#""ms"?"#), "{}", stdout(&output));
    assert!(
        policy(&["schema"])
            .stdout
            .windows(6)
            .any(|w| w == br#""ms"?:"#)
    );
}

/// `agentloop run` of the embedded stack in a fresh data directory.
fn run(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .arg("--data-dir")
        .arg(dir)
        .arg("run")
        .args(args)
        .env_remove("AGENTLOOP_TOKEN")
        .output()
        .unwrap()
}

#[test]
fn an_embedded_run_is_authorized_by_the_policies_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("transfer.json");
    std::fs::write(
        &script,
        r#"{"turns": [
          {"tool_calls": [{"id": "t1", "name": "transfer", "arguments": {"from": "alice", "to": "bob", "amount": 500}}]},
          {"final": "moved"}]}"#,
    )
    .unwrap();
    let script = script.to_str().unwrap();
    let data = dir.path().join("data");
    let data = data.as_path();

    let clerk = run(
        data,
        &[
            "--script",
            script,
            "--policies",
            DEMO,
            "--roles",
            "clerk",
            "--json",
        ],
    );
    assert_eq!(clerk.status.code(), Some(0), "{}", stderr(&clerk));

    // Without the clerk role nothing permits the transfer: `invalid_decision` (exit code
    // of docs/cli.md), naming no policy since none permits it.
    let stranger = run(data, &["--script", script, "--policies", DEMO, "--json"]);
    let summary: serde_json::Value = serde_json::from_str(&stdout(&stranger)).unwrap();
    assert_eq!(summary["reason"], "invalid_decision", "{summary}");
    assert!(
        summary["detail"]
            .as_str()
            .unwrap()
            .contains("no policy permits"),
        "{summary}"
    );

    // Policies that do not load stop the run before anything starts: exit 78.
    let bad = dir.path().join("bad.cedar");
    std::fs::write(
        &bad,
        "permit(principal, action, resource) when { principal.nope };",
    )
    .unwrap();
    let refused = run(
        data,
        &["--script", script, "--policies", bad.to_str().unwrap()],
    );
    assert_eq!(refused.status.code(), Some(78), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("bad.cedar:1:"),
        "{}",
        stderr(&refused)
    );
}
