//! The `agentloop` binary as a user runs it: output, `--json`, and exit codes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
mod common;

use std::process::{Command, Output};

use common::{dev, stderr, stdout};

fn agentloop(data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn demo_prints_the_examples_result_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let output = agentloop(dir.path(), &["demo"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "completed\nprofile=active; policy=refund-under-100\naccepted by: answer; citations (call-profile, call-policy)\nsteps=2 tool_calls=2 events=2\n"
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

#[test]
fn acceptance_rules_from_a_file_judge_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    std::fs::write(path("accept.toml"), "require_citations = true\n").unwrap();
    let lookup = r#"{"id": "c", "name": "lookup", "arguments": {"key": "profile"}}"#;
    let guess = format!(
        r#"{{"turns": [{{"tool_calls": [{lookup}]}}, {{"final": "active"}}, {{"final": "active"}}]}}"#
    );
    let cited = format!(
        r#"{{"turns": [{{"tool_calls": [{lookup}]}}, {{"final": "active", "evidence": ["c"]}}]}}"#
    );
    std::fs::write(path("guess.json"), guess).unwrap();
    std::fs::write(path("cited.json"), cited).unwrap();
    let run = |script: &str, rules: &str| {
        agentloop(
            &data,
            &[
                "run",
                "--script",
                &path(script),
                "--acceptance",
                &path(rules),
                "--json",
            ],
        )
    };

    let refused = run("guess.json", "accept.toml");
    assert_eq!(refused.status.code(), Some(22), "{}", stderr(&refused));
    let summary: serde_json::Value = serde_json::from_str(&stdout(&refused)).unwrap();
    assert_eq!(summary["reason"], "verification_failed");
    assert!(
        summary["detail"]
            .as_str()
            .unwrap()
            .contains("cites no result")
    );

    let accepted = run("cited.json", "accept.toml");
    assert_eq!(accepted.status.code(), Some(0), "{}", stderr(&accepted));
    let summary: serde_json::Value = serde_json::from_str(&stdout(&accepted)).unwrap();
    let citations = summary["accepted_by"]
        .as_array()
        .unwrap()
        .iter()
        .find(|check| check["name"] == "citations")
        .unwrap();
    assert_eq!(citations["evidence"], serde_json::json!(["c"]));
    assert_eq!(citations["kind"], "rule");

    // Rules that do not load stop the run before it starts: a bad configuration.
    for (name, rules) in [
        ("unknown-tool.toml", "[[require]]\ntool = \"refund\"\n"),
        ("not-toml.toml", "require_citations = \n"),
    ] {
        std::fs::write(path(name), rules).unwrap();
        let output = run("cited.json", name);
        assert_eq!(
            output.status.code(),
            Some(78),
            "{name}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains("acceptance rules of profile \"default\""),
            "{}",
            stderr(&output)
        );
    }
}

#[test]
fn an_approval_given_later_resumes_under_the_runs_acceptance_rules() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    std::fs::write(
        path("accept.toml"),
        "require_citations = true\nverifiers = [\"transfer_recorded\"]\n",
    )
    .unwrap();
    let refund = r#"{"turns": [
        {"request_approval": {"summary": "refund", "calls": [{"id": "t1", "name": "transfer",
          "arguments": {"from": "ops", "to": "acct-1", "amount": 4000}}]}},
        {"final": "refunded", "evidence": ["t1"]}]}"#;
    std::fs::write(path("refund.json"), refund).unwrap();
    let waiting = agentloop(
        &data,
        &[
            "run",
            "--script",
            &path("refund.json"),
            "--acceptance",
            &path("accept.toml"),
            "--on-wait",
            "exit",
            "--json",
        ],
    );
    assert_eq!(waiting.status.code(), Some(10), "{}", stderr(&waiting));
    let summary: serde_json::Value = serde_json::from_str(&stdout(&waiting)).unwrap();
    let pending = &summary["waiting"];
    let commands = pending["commands"].as_array().unwrap();
    assert!(
        commands
            .iter()
            .all(|c| c.as_str().unwrap().contains("--acceptance")),
        "the printed commands resume it under the same rules: {commands:?}"
    );

    let id = pending["invocation_id"].as_str().unwrap();
    let digest = pending["proposal_digest"].as_str().unwrap();
    let approved = agentloop(
        &data,
        &[
            "approve",
            id,
            "--digest",
            digest,
            "--acceptance",
            &path("accept.toml"),
            "--json",
        ],
    );
    assert_eq!(approved.status.code(), Some(0), "{}", stderr(&approved));
    let summary: serde_json::Value = serde_json::from_str(&stdout(&approved)).unwrap();
    let names: Vec<&str> = summary["accepted_by"]
        .as_array()
        .unwrap()
        .iter()
        .map(|check| check["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"transfer_recorded"), "{names:?}");
}

#[test]
fn list_shows_each_run_and_watch_follows_one_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let demo = agentloop(&data, &["demo", "--json"]);
    assert_eq!(demo.status.code(), Some(0), "{}", stderr(&demo));
    let summary: serde_json::Value = serde_json::from_str(&stdout(&demo)).unwrap();
    let completed = summary["invocation_id"].as_str().unwrap().to_owned();
    let script = dir.path().join("ask.json");
    std::fs::write(
        &script,
        r#"{"turns": [{"clarification": "Which account?"}, {"final": "ok"}]}"#,
    )
    .unwrap();
    let asked = agentloop(
        &data,
        &[
            "run",
            "--script",
            script.to_str().unwrap(),
            "--goal",
            "ask first",
            "--on-wait",
            "exit",
        ],
    );
    assert_eq!(asked.status.code(), Some(11), "{}", stderr(&asked));

    let rows = |args: &[&str]| -> Vec<serde_json::Value> {
        let listed = agentloop(&data, args);
        assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
        stdout(&listed)
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    };
    let all = rows(&["list", "--json"]);
    assert_eq!(all.len(), 2, "{all:?}");
    // Newest first.
    assert_eq!(all[0]["state"], "waiting: clarification_required");
    assert_eq!(all[0]["goal"], "ask first");
    assert_eq!(all[1]["invocation_id"], completed.as_str());
    assert_eq!(all[1]["state"], "ended: completed");
    assert_eq!(all[1]["steps"], 2);
    let waiting = rows(&["list", "--state", "waiting", "--json"]);
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0]["goal"], "ask first");
    assert_eq!(rows(&["list", "--limit", "1", "--json"]).len(), 1);
    let completed_ones = rows(&["list", "--reason", "completed", "--json"]);
    assert_eq!(completed_ones.len(), 1);
    assert_eq!(completed_ones[0]["invocation_id"], completed.as_str());
    let bad = agentloop(&data, &["list", "--reason", "fine"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    let text = agentloop(&data, &["list"]);
    assert!(stdout(&text).contains(&completed), "{}", stdout(&text));

    let watched = agentloop(&data, &["watch", &completed]);
    assert_eq!(watched.status.code(), Some(0), "{}", stderr(&watched));
    let text = stdout(&watched);
    assert!(text.contains("lookup(call-profile)"), "{text}");
    assert!(text.contains("ended    completed"), "{text}");
    let json = agentloop(&data, &["watch", &completed, "--from-seq", "2", "--json"]);
    let lines: Vec<serde_json::Value> = stdout(&json)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // Events 2 (the final turn) and 3 (its end), then the summary.
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0]["seq"], 2);
    assert_eq!(lines[1]["kind"], "ended");
    assert_eq!(lines[2]["invocation_id"], completed.as_str());
    assert_eq!(lines[2]["reason"], "completed");
}

#[test]
fn dev_prints_where_it_serves_the_console_and_http_and_serves_both_there() {
    let dir = tempfile::tempdir().unwrap();
    let (mut running, _grpc) = dev(dir.path(), &["--http", "127.0.0.1:0"]);
    let line = running.line();
    let console = line
        .strip_prefix("agentloop dev: the console on http://")
        .unwrap_or_else(|| panic!("no console URL in {line:?}"));
    let console = console.strip_suffix('/').unwrap();
    let line = running.line();
    let url = line
        .strip_prefix("agentloop dev: the HTTP/JSON API on http://")
        .unwrap_or_else(|| panic!("no HTTP URL in {line:?}"));
    let address = url.strip_suffix("/v1/invocations").unwrap();
    assert_eq!(console, address, "one listener serves both");
    let get = |path: &str| {
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        use std::io::{Read, Write};
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    };
    let answer = get("/v1/invocations");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("application/json"), "{answer}");
    let page = get("/");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        page.to_ascii_lowercase()
            .contains("content-security-policy: default-src 'none'"),
        "{page}"
    );
    assert!(page.contains("agentloop console"), "{page}");
}
