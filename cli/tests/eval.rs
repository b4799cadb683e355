//! `agentloop eval`: the shipped suite passes, a wrong expectation fails the command and
//! is named in the JUnit report with its first difference, a case file that cannot be
//! read is refused before anything runs, and the printed schema describes the cases.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly"
)]

mod common;

use std::path::{Path, PathBuf};

use common::{agentloop, stderr, stdout};

/// The suite under `examples/evals`.
fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/evals")
}

/// What `output` printed, once it exited with `code` (else fails, showing both streams).
fn exited(output: &std::process::Output, code: i32) -> String {
    let printed = stdout(output);
    assert_eq!(
        output.status.code(),
        Some(code),
        "{printed}{}",
        stderr(output)
    );
    printed
}

/// The shipped suite's cases (not the scripts or rules they name), as JSON.
fn shipped_cases() -> Vec<(PathBuf, serde_json::Value)> {
    let mut cases: Vec<(PathBuf, serde_json::Value)> = std::fs::read_dir(shipped())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .map(|path| {
            let case = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            (path, case)
        })
        .collect();
    cases.sort_by(|a, b| a.0.cmp(&b.0));
    cases
}

#[test]
fn the_shipped_suite_passes_and_prints_the_aggregate() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("eval.xml");
    let output = agentloop(dir.path())
        .arg("eval")
        .arg(shipped())
        .arg("--junit")
        .arg(&junit)
        .output()
        .unwrap();
    let printed = exited(&output, 0);
    let cases = shipped_cases();
    assert!(cases.len() >= 10, "the suite covers the runtime's branches");
    for (path, case) in &cases {
        let name = case["name"].as_str().unwrap();
        assert!(
            printed.contains(&format!("pass {name}\n")),
            "{}: {printed}",
            path.display()
        );
    }
    let runs = cases.len();
    assert!(
        printed.contains(&format!("passed {runs} of {runs} runs (100.0%)")),
        "{printed}"
    );
    for aggregate in [
        "tool accuracy 100.0%, argument accuracy 100.0%, stop-reason accuracy 100.0%",
        "side effects: 0 duplicate, 0 unauthorized",
        "duration completed (",
        "duration approval_required (1 runs)",
    ] {
        assert!(printed.contains(aggregate), "{aggregate}: {printed}");
    }
    let report = std::fs::read_to_string(&junit).unwrap();
    assert!(
        report.contains(&format!("tests=\"{runs}\" failures=\"0\"")),
        "{report}"
    );
}

#[test]
fn a_wrong_case_fails_and_the_junit_report_names_it_with_its_first_difference() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = shipped();
    let mut wrong: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shipped.join("one-call.json")).unwrap())
            .unwrap();
    wrong["name"] = "the wrong key".into();
    wrong["expect"]["trajectory"]["calls"][0]["arguments"]["key"] = "profile".into();
    std::fs::write(dir.path().join("wrong.json"), wrong.to_string()).unwrap();
    let junit = dir.path().join("eval.xml");
    let run = |extra: &[&str]| {
        agentloop(dir.path())
            .arg("eval")
            .arg(shipped.join("one-call.json"))
            .arg("wrong.json")
            .arg("--junit")
            .arg(&junit)
            .args(extra)
            .output()
            .unwrap()
    };

    let output = run(&[]);
    let printed = exited(&output, 1);
    let first = r#"trajectory (exact): call 1 is lookup {"key":"policy"} (call p), expected lookup {"key":"profile"}"#;
    assert!(printed.contains("pass one call\n"), "{printed}");
    assert!(
        printed.contains(&format!("FAIL the wrong key: {first}\n")),
        "{printed}"
    );
    assert!(printed.contains("passed 1 of 2 runs (50.0%)"), "{printed}");
    let report = std::fs::read_to_string(&junit).unwrap();
    assert!(report.contains("tests=\"2\" failures=\"1\""), "{report}");
    let escaped = first.replace('"', "&quot;");
    assert!(
        report.contains(
            "<testcase name=\"the wrong key\" classname=\"wrong.json\" file=\"wrong.json\""
        ) && report.contains(&format!(
            "<failure message=\"{escaped}\" type=\"difference\">"
        )),
        "{report}"
    );
    assert!(
        report.contains("<testcase name=\"one call\"") && report.matches("<failure").count() == 1,
        "only the wrong case fails: {report}"
    );

    // Enough passed for the gate, which still reports the failure.
    let gated = run(&["--min-pass-rate", "0.5"]);
    assert_eq!(gated.status.code(), Some(0), "{}", stdout(&gated));
    assert!(stdout(&gated).contains("FAIL the wrong key"));
    assert_eq!(run(&["--min-pass-rate", "0.51"]).status.code(), Some(1));
}

#[test]
fn a_suite_that_cannot_be_read_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let case = |name: &str, expect: &str| {
        format!(
            r#"{{"name": "{name}", "goal": "g", "script": {{"turns": [{{"final": "x"}}]}}, {expect}}}"#
        )
    };
    std::fs::write(
        dir.path().join("misspelt.json"),
        case("a", r#""expect": {"reasons": "completed"}"#),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("twice-1.json"),
        case("b", r#""expect": {}"#),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("twice-2.json"),
        case("b", r#""expect": {}"#),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("regex.json"),
        case("c", r#""expect": {"answer": {"matches": "("}}"#),
    )
    .unwrap();
    let output = agentloop(dir.path()).args(["eval", "."]).output().unwrap();
    let errors = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{errors}");
    assert!(
        errors.contains("misspelt.json: unknown field `reasons`"),
        "{errors}"
    );
    assert!(
        errors.contains("twice-2.json: another case is named \"b\""),
        "{errors}"
    );
    assert!(
        errors.contains("regex.json: `expect.answer.matches`"),
        "{errors}"
    );
    assert!(stdout(&output).is_empty(), "nothing ran");

    let empty = tempfile::tempdir().unwrap();
    let output = agentloop(empty.path())
        .args(["eval", "."])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("no case files"));
}

#[test]
fn the_printed_schema_accepts_the_shipped_cases_and_refuses_unknown_keys() {
    let dir = tempfile::tempdir().unwrap();
    let output = agentloop(dir.path())
        .args(["eval", "--schema"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let schema: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for (path, case) in shipped_cases() {
        if let Err(error) = validator.validate(&case) {
            panic!("{}: {error}", path.display());
        }
    }
    let (_, mut case) = shipped_cases().remove(0);
    case["expect"]["reasons"] = "completed".into();
    assert!(!validator.is_valid(&case));
    case["expect"].as_object_mut().unwrap().remove("reasons");
    case["expect"]["trajectory"] = serde_json::json!({"match": "sideways", "calls": []});
    assert!(!validator.is_valid(&case));
}

#[test]
fn cases_run_on_a_server_and_those_that_need_their_own_stack_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, endpoint) = common::dev(dir.path(), &[]);
    let shipped = shipped();
    let output = agentloop(dir.path())
        .arg("eval")
        .arg(shipped.join("one-call.json"))
        .arg(shipped.join("approval-approved.json"))
        .args(["--server", &endpoint])
        .output()
        .unwrap();
    let printed = exited(&output, 0);
    assert!(printed.contains("pass one call\n"), "{printed}");
    assert!(
        printed.contains("pass a write that needs approval, approved\n"),
        "{printed}"
    );
    // The runs are the server's: its list holds both.
    let listed = agentloop(dir.path())
        .args(["list", "--json", "--server", &endpoint])
        .output()
        .unwrap();
    assert_eq!(stdout(&listed).lines().count(), 2, "{}", stdout(&listed));

    let refused = agentloop(dir.path())
        .arg("eval")
        .arg(shipped.join("write-reply-lost.json"))
        .args(["--server", &endpoint])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("only the embedded stack of each case can take (not --server)"),
        "{}",
        stderr(&refused)
    );
}

#[test]
fn a_crash_with_no_write_to_crash_after_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("no-write.json"),
        r#"{"name": "nothing to crash after", "goal": "g",
            "script": {"turns": [{"final": "done"}]},
            "faults": {"crash": "after_write_sent"}}"#,
    )
    .unwrap();
    let output = agentloop(dir.path())
        .args(["eval", "no-write.json"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stdout(&output).contains(
            "FAIL nothing to crash after: not run: the run applied no write to crash after\n"
        ),
        "{}",
        stdout(&output)
    );
}
