//! The `agentloop` binary as a user runs it: output, `--json`, and exit codes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
mod common;

use std::process::{Command, Output};

use common::{stderr, stdout};

fn agentloop(data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn demo_prints_the_seed_result_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let output = agentloop(dir.path(), &["demo"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "completed\nprofile=active; policy=refund-under-100\nsteps=2 tool_calls=2 events=2\n"
    );
}

#[test]
fn demo_json_and_show_read_the_same_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let output = agentloop(dir.path(), &["demo", "--json"]);
    assert_eq!(output.status.code(), Some(0));
    let summary: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(summary["reason"], "completed");
    assert_eq!(summary["steps"], 2);
    assert_eq!(summary["tool_calls"], 2);
    assert_eq!(summary["events"], 2);
    let id = summary["invocation_id"].as_str().unwrap();

    let shown = agentloop(dir.path(), &["show", id]);
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let text = stdout(&shown);
    assert!(text.contains("turn 1"), "{text}");
    assert!(text.contains("lookup(call-profile)"), "{text}");
    assert!(text.contains("ended    completed"), "{text}");

    let json = agentloop(dir.path(), &["show", id, "--json"]);
    let lines: Vec<serde_json::Value> = stdout(&json)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["calls"][1]["call_id"], "call-policy");
    assert_eq!(lines[2]["reason"], "completed");

    let unknown = agentloop(
        dir.path(),
        &["show", "0190aaaa-0000-7000-8000-000000000000"],
    );
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        stderr(&unknown).contains("no invocation"),
        "{}",
        stderr(&unknown)
    );
}

#[test]
fn each_terminal_reason_has_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let lookup = r#"{"id": "c", "name": "lookup", "arguments": {"key": "profile"}}"#;
    let cases: Vec<(String, Vec<&str>, i32, &str)> = vec![
        (format!(r#"{{"turns": [{{"tool_calls": [{lookup}]}}], "repeat_last": true}}"#), vec![], 17, "no_progress"),
        (
            format!(r#"{{"turns": [{{"tool_calls": [{lookup}]}}], "repeat_last": true}}"#),
            vec!["--max-repeated-plan", "0", "--max-steps", "3"],
            14,
            "max_steps",
        ),
        (
            format!(r#"{{"turns": [{{"tool_calls": [{lookup}, {lookup}]}}]}}"#),
            vec![],
            18,
            "invalid_decision",
        ),
        (r#"{"turns": [{"clarification": "Which account?"}]}"#.into(), vec![], 11, "clarification_required"),
        (r#"{"turns": [{"cannot_continue": "no access"}]}"#.into(), vec![], 21, "cannot_continue"),
        (r#"{"turns": [{"model_error": "HTTP 503"}]}"#.into(), vec![], 19, "model_error"),
        (
            format!(r#"{{"turns": [{{"tool_calls": [{lookup}]}}], "repeat_last": true}}"#),
            vec!["--max-tool-calls", "1"],
            15,
            "tool_budget_exhausted",
        ),
        (
            r#"{"turns": [{"tool_calls": [{"id": "s", "name": "sleep", "arguments": {"ms": 60000}}]}]}"#.into(),
            vec!["--deadline", "200ms"],
            13,
            "deadline_exceeded",
        ),
    ];
    for (index, (script, extra, code, reason)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("script-{index}.json"));
        std::fs::write(&path, script).unwrap();
        let mut args = vec!["run", "--script", path.to_str().unwrap(), "--json"];
        args.extend(extra);
        let output = agentloop(&dir.path().join("data"), &args);
        assert_eq!(
            output.status.code(),
            Some(code),
            "{reason}: {}",
            stderr(&output)
        );
        let summary: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
        assert_eq!(summary["reason"], reason);
    }
}

#[test]
fn bad_usage_and_bad_input_are_reported_with_distinct_codes() {
    let dir = tempfile::tempdir().unwrap();
    let usage = agentloop(dir.path(), &["run"]);
    assert_eq!(
        usage.status.code(),
        Some(2),
        "missing --script is a usage error"
    );
    let missing = agentloop(dir.path(), &["run", "--script", "/no/such/file.json"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("cannot read the script"),
        "{}",
        stderr(&missing)
    );
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"turns": [{"fnal": "typo"}]}"#).unwrap();
    let malformed = agentloop(dir.path(), &["run", "--script", bad.to_str().unwrap()]);
    assert_eq!(malformed.status.code(), Some(1));
    assert!(
        stderr(&malformed).contains("InvalidArgument"),
        "{}",
        stderr(&malformed)
    );
    assert!(
        stderr(&malformed).contains("fnal"),
        "{}",
        stderr(&malformed)
    );
    let deadline = agentloop(
        dir.path(),
        &[
            "run",
            "--script",
            bad.to_str().unwrap(),
            "--deadline",
            "soon",
        ],
    );
    assert_eq!(deadline.status.code(), Some(2));
}
