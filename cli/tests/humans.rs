//! The README's human-in-the-loop example, with the real binary: a run stops to wait for
//! an approval, `pending` shows the exact calls, `approve` refuses to guess off a
//! terminal and then approves the pinned digest, and the write is applied once by the
//! executor's own record. Also: a denial, an answer to a question, and a run that stays
//! attached to a `dev` server and follows the invocation after another process approves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};

const APPROVAL: &str = r#"{"turns": [
  {"request_approval": {"summary": "Refund 40.00 to acct-1",
    "calls": [{"id": "t1", "name": "transfer",
               "arguments": {"to": "acct-1", "from": "acct-ops", "amount": 4000}}]}},
  {"final": "refunded 40.00 to acct-1"}
]}"#;

fn agentloop(dir: &Path, args: &[&str]) -> Output {
    command(dir).args(args).output().unwrap()
}

fn command(dir: &Path) -> Command {
    let mut command = common::agentloop(dir);
    command.args(["--data-dir", "data"]).stdin(Stdio::null());
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn json(output: &Output) -> serde_json::Value {
    serde_json::from_str(&text(&output.stdout))
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", text(&output.stdout), text(&output.stderr)))
}

fn transfers(dir: &Path) -> usize {
    agentloop_demo_executor::read_record(&dir.join("data").join("demo-executor"))
        .unwrap()
        .len()
}

/// Runs `script` until it waits; returns the summary's `waiting` part.
fn run_until_waiting(dir: &Path, script: &str) -> serde_json::Value {
    std::fs::write(dir.join("script.json"), script).unwrap();
    let run = agentloop(dir, &["run", "--script", "script.json", "--json"]);
    let summary = json(&run);
    assert_eq!(
        run.status.code(),
        Some(if summary["reason"] == "approval_required" {
            10
        } else {
            11
        }),
        "{}",
        text(&run.stderr)
    );
    summary["waiting"].clone()
}

#[test]
fn a_run_waits_for_approval_and_approve_runs_exactly_the_calls_shown() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let waiting = run_until_waiting(dir, APPROVAL);
    let id = waiting["invocation_id"].as_str().unwrap().to_owned();
    let digest = waiting["proposal_digest"].as_str().unwrap().to_owned();
    assert_eq!(waiting["reason"], "approval_required");
    assert_eq!(waiting["text"], "Refund 40.00 to acct-1");
    // The exact call, its arguments canonical (sorted keys, no spaces).
    assert_eq!(waiting["calls"][0]["call_id"], "t1");
    assert_eq!(waiting["calls"][0]["tool"], "transfer");
    assert_eq!(
        waiting["calls"][0]["arguments"],
        r#"{"amount":4000,"from":"acct-ops","to":"acct-1"}"#
    );
    assert_eq!(
        waiting["commands"][0],
        format!("agentloop approve {id} --digest {digest} --data-dir data")
    );
    assert_eq!(transfers(dir), 0, "nothing runs before the approval");

    let pending = agentloop(dir, &["pending", "--json"]);
    assert_eq!(pending.status.code(), Some(0));
    let listed = json(&pending);
    assert_eq!(listed["invocation_id"], id);
    assert_eq!(listed["proposal_digest"], digest);

    // Off a terminal, approve asks nobody: it needs the digest (or --yes).
    let unasked = agentloop(dir, &["approve", &id]);
    assert_eq!(unasked.status.code(), Some(1));
    assert!(
        text(&unasked.stderr).contains("--digest"),
        "{}",
        text(&unasked.stderr)
    );
    let wrong = agentloop(dir, &["approve", &id, "--digest", &"0".repeat(64)]);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        text(&wrong.stderr).contains("nothing was resolved"),
        "{}",
        text(&wrong.stderr)
    );
    assert_eq!(transfers(dir), 0);

    let approved = agentloop(dir, &["approve", &id, "--digest", &digest, "--json"]);
    assert_eq!(
        approved.status.code(),
        Some(0),
        "{}",
        text(&approved.stderr)
    );
    let summary = json(&approved);
    assert_eq!(summary["reason"], "completed");
    assert_eq!(summary["answer"], "refunded 40.00 to acct-1");
    assert_eq!(transfers(dir), 1, "applied once");

    // Resolved: a second approval finds nothing waiting, and applies nothing.
    let again = agentloop(dir, &["approve", &id, "--yes"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stderr).contains("does not wait"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(transfers(dir), 1);
    let pending = agentloop(dir, &["pending"]);
    assert_eq!(text(&pending.stdout), "nothing waits for a human\n");

    let shown = agentloop(dir, &["show", &id]);
    let timeline = text(&shown.stdout);
    assert!(
        timeline.contains("waiting  approval_required"),
        "{timeline}"
    );
    assert!(timeline.contains("approval_resolved"), "{timeline}");
}

#[test]
fn a_denial_runs_nothing_and_an_answer_resumes_a_question() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let waiting = run_until_waiting(dir, APPROVAL);
    let id = waiting["invocation_id"].as_str().unwrap().to_owned();
    let denied = agentloop(
        dir,
        &[
            "approve",
            &id,
            "--deny",
            "--comment",
            "not above 20.00",
            "--json",
        ],
    );
    assert_eq!(denied.status.code(), Some(0), "{}", text(&denied.stderr));
    assert_eq!(json(&denied)["reason"], "completed");
    assert_eq!(transfers(dir), 0, "a denial runs nothing");
    let shown = agentloop(dir, &["show", &id, "--json"]);
    assert!(
        text(&shown.stdout).contains("denied by"),
        "{}",
        text(&shown.stdout)
    );

    let question = r#"{"turns": [{"clarification": "Which account?"}, {"final": "acct-1 it is"}]}"#;
    let waiting = run_until_waiting(dir, question);
    assert_eq!(waiting["reason"], "clarification_required");
    assert_eq!(waiting["text"], "Which account?");
    let id = waiting["invocation_id"].as_str().unwrap().to_owned();
    let empty = agentloop(dir, &["answer", &id, "  "]);
    assert_eq!(empty.status.code(), Some(1), "an empty answer is refused");
    let answered = agentloop(dir, &["answer", &id, "acct-1", "--json"]);
    assert_eq!(
        answered.status.code(),
        Some(0),
        "{}",
        text(&answered.stderr)
    );
    assert_eq!(json(&answered)["answer"], "acct-1 it is");
}

#[test]
fn an_attached_run_follows_the_invocation_after_another_process_approves() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (_dev, endpoint) = common::dev(dir, &[]);

    std::fs::write(dir.join("script.json"), APPROVAL).unwrap();
    let mut run = command(dir)
        .args(["run", "--server", &endpoint, "--script", "script.json"])
        .args(["--on-wait", "follow", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The run says it waits, with the command that resumes it, and keeps following.
    let mut stderr = BufReader::new(run.stderr.take().unwrap());
    let mut notice = String::new();
    let mut command_line = None;
    while !notice.contains("following it") {
        let mut line = String::new();
        assert_ne!(
            stderr.read_line(&mut line).unwrap(),
            0,
            "run ended: {notice}"
        );
        if line.trim_start().starts_with("agentloop approve") && command_line.is_none() {
            command_line = Some(line.trim().to_owned());
        }
        notice.push_str(&line);
    }
    let command_line = command_line.unwrap_or_else(|| panic!("no command in {notice}"));
    assert!(
        command_line.ends_with(&format!("--server {endpoint}")),
        "{command_line}"
    );
    // Run exactly the printed command, from another process.
    let words: Vec<&str> = command_line.split_whitespace().skip(1).collect();
    let approved = agentloop(dir, &words);
    assert_eq!(
        approved.status.code(),
        Some(0),
        "{}",
        text(&approved.stderr)
    );

    let output = run.wait_with_output().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert_eq!(output.status.code(), Some(0), "{notice}{rest}");
    let summary = json(&output);
    assert_eq!(summary["reason"], "completed");
    assert_eq!(summary["tool_calls"], 1);
}

/// server-everything's form question (stdio, from npm): `name` required, `integer`
/// defaulting to 42.
const ASKS_FORM: &str = r#"{"turns": [
  {"tool_calls": [{"id": "form", "name": "everything__trigger-elicitation-request", "arguments": {}}]},
  {"final": "the form came back", "evidence": ["form"]}
]}"#;

#[test]
fn a_tools_question_is_shown_by_pending_and_answered_by_answer() {
    if !agentloop_e2e::mcp_server_installed("mcp-server-everything") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(
        dir.join("tools.toml"),
        "[[mcp_servers]]\nname = \"everything\"\ncommand = \"mcp-server-everything\"\nargs = [\"stdio\"]\n",
    )
    .unwrap();
    std::fs::write(dir.join("script.json"), ASKS_FORM).unwrap();
    let run = agentloop(
        dir,
        &[
            "run",
            "--tools",
            "tools.toml",
            "--script",
            "script.json",
            "--json",
        ],
    );
    assert_eq!(run.status.code(), Some(11), "{}", text(&run.stderr));
    let waiting = json(&run)["waiting"].clone();
    assert_eq!(
        waiting["text"],
        "Please provide inputs for the following fields:"
    );
    assert_eq!(
        waiting["input"]["tool"],
        "everything__trigger-elicitation-request"
    );
    assert_eq!(waiting["input"]["schema"]["required"][0], "name");
    let commands = waiting["commands"].to_string();
    assert!(commands.contains("--decline"), "{commands}");
    assert!(commands.contains("--tools tools.toml"), "{commands}");
    let id = waiting["invocation_id"].as_str().unwrap().to_owned();

    let pending = agentloop(dir, &["pending", "--json"]);
    let listed = json(&pending);
    assert_eq!(listed["input"], waiting["input"]);

    // Outside the schema: refused, nothing written, still waiting.
    let wrong = agentloop(
        dir,
        &["answer", &id, r#"{"integer": 7}"#, "--tools", "tools.toml"],
    );
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        text(&wrong.stderr).contains("requested schema"),
        "{}",
        text(&wrong.stderr)
    );
    assert_eq!(
        json(&agentloop(dir, &["pending", "--json"]))["invocation_id"],
        id.as_str()
    );

    let answered = agentloop(
        dir,
        &[
            "answer",
            &id,
            r#"{"name": "Ada Lovelace"}"#,
            "--tools",
            "tools.toml",
            "--json",
        ],
    );
    assert_eq!(
        answered.status.code(),
        Some(0),
        "{}",
        text(&answered.stderr)
    );
    assert_eq!(json(&answered)["reason"], "completed");
    let shown = text(&agentloop(dir, &["show", &id, "--json"]).stdout);
    assert!(shown.contains("Name: Ada Lovelace"), "{shown}");
    assert!(shown.contains("Favorite Integer: 42"), "a default: {shown}");
}
