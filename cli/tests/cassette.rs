//! Cassettes: a run against an OpenAI-compatible server (a strict mock: the path, the
//! key and the request shape must be right, or it answers 404) is recorded with
//! `run --record`, replayed with `run --cassette` without a single request to the model,
//! and a replay whose tool answers differently ends `model_error` naming the turn.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly"
)]

mod common;

use std::path::Path;

use common::{agentloop, stderr, stdout};
use serde_json::{Value, json};
use wiremock::matchers::{body_partial_json, body_string_contains, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const KEY: &str = "sk-cassette-test";

/// The first turn's answer: one lookup.
fn tool_calls() -> Value {
    json!({
        "id": "chatcmpl-rec-1", "object": "chat.completion", "created": 1_727_000_000,
        "model": "gpt-test-2026",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": null,
            "message": {"role": "assistant", "content": null, "refusal": null, "tool_calls": [
                {"id": "call_profile", "type": "function",
                 "function": {"name": "lookup", "arguments": "{\"key\":\"profile\"}"}}]}}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 14, "total_tokens": 134}
    })
}

/// The second turn's answer, once the lookup's result is in the request.
fn final_answer() -> Value {
    json!({
        "id": "chatcmpl-rec-2", "object": "chat.completion", "created": 1_727_000_001,
        "model": "gpt-test-2026",
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": null,
            "message": {"role": "assistant", "content": "The profile is active.", "refusal": null}}],
        "usage": {"prompt_tokens": 160, "completion_tokens": 7, "total_tokens": 167}
    })
}

/// `run` in `dir` with `args`, the model's server at `base`; its JSON summary.
fn run(dir: &Path, base: &str, args: &[&str]) -> Value {
    let output = agentloop(dir)
        .env("OPENAI_BASE_URL", base)
        .env("OPENAI_API_KEY", KEY)
        .args(["--data-dir", "data", "run", "--json", "--on-wait", "exit"])
        .args(args)
        .output()
        .unwrap();
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("{}{}", stdout(&output), stderr(&output)))
}

/// An invocation's events as `show --json` prints them, without what differs between
/// two runs of the same decisions (IDs, times).
fn log(dir: &Path, id: &str) -> Vec<Value> {
    let output = agentloop(dir)
        .args(["--data-dir", "data", "show", "--json", id])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    stdout(&output)
        .lines()
        .map(|line| {
            let mut event: Value = serde_json::from_str(line).unwrap();
            for key in ["invocation_id", "committed_at_ms"] {
                if let Some(object) = event.as_object_mut() {
                    object.remove(key);
                }
            }
            event
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recorded_run_replays_without_the_model_and_a_diverging_replay_names_its_turn() {
    let server = MockServer::start().await;
    let strict = || {
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .and(header("authorization", format!("Bearer {KEY}").as_str()))
            .and(body_partial_json(json!({"model": "gpt-test"})))
    };
    strict()
        .and(body_string_contains("call_profile"))
        .respond_with(ResponseTemplate::new(200).set_body_json(final_answer()))
        .with_priority(1)
        .mount(&server)
        .await;
    strict()
        .respond_with(ResponseTemplate::new(200).set_body_json(tool_calls()))
        .with_priority(2)
        .mount(&server)
        .await;
    let base = format!("{}/v1", server.uri());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();

    // Recorded: two requests to the model, two turns in the cassette.
    let recorded = {
        let (path, base) = (path.clone(), base.clone());
        tokio::task::spawn_blocking(move || {
            run(
                &path,
                &base,
                &[
                    "--model",
                    "openai:gpt-test",
                    "--goal",
                    "Check the profile",
                    "--record",
                    "cassette.json",
                ],
            )
        })
        .await
        .unwrap()
    };
    assert_eq!(recorded["reason"], "completed", "{recorded}");
    assert_eq!(recorded["answer"], "The profile is active.");
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
    let cassette: Value =
        serde_json::from_str(&std::fs::read_to_string(path.join("cassette.json")).unwrap())
            .unwrap();
    assert_eq!(cassette["model"], "openai:gpt-test");
    assert_eq!(cassette["goal"], "Check the profile");
    let turns = cassette["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[0]["response_id"], "chatcmpl-rec-1");
    assert_eq!(turns[1]["usage"]["input_tokens"], 160);

    // Replayed: the same run, and not one request more to the model.
    let replayed = {
        let (path, base) = (path.clone(), base.clone());
        tokio::task::spawn_blocking(move || run(&path, &base, &["--cassette", "cassette.json"]))
            .await
            .unwrap()
    };
    assert_eq!(
        server.received_requests().await.unwrap().len(),
        2,
        "no model call"
    );
    for key in [
        "reason",
        "answer",
        "steps",
        "tool_calls",
        "events",
        "input_tokens",
        "output_tokens",
    ] {
        assert_eq!(replayed[key], recorded[key], "{key}: {replayed}");
    }
    let ids = |summary: &Value| summary["invocation_id"].as_str().unwrap().to_owned();
    let (first, second) = (ids(&recorded), ids(&replayed));
    let (recorded_log, replayed_log) = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || (log(&path, &first), log(&path, &second)))
            .await
            .unwrap()
    };
    assert_eq!(
        replayed_log, recorded_log,
        "the same decisions, results and usage"
    );

    // An evaluation case replays it too, judged like any run.
    std::fs::write(
        path.join("case.json"),
        json!({
            "name": "the recorded lookup",
            "goal": "Check the profile",
            "cassette": "cassette.json",
            "expect": {
                "reason": "completed",
                "trajectory": {"match": "exact", "calls": [{"name": "lookup", "arguments": {"key": "profile"}}]},
                "answer": {"contains": "active"},
                "max_tokens": 301
            }
        })
        .to_string(),
    )
    .unwrap();
    let evaluated = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || {
            agentloop(&path)
                .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
                .args(["eval", "case.json"])
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    };
    assert_eq!(
        evaluated.status.code(),
        Some(0),
        "{}{}",
        stdout(&evaluated),
        stderr(&evaluated)
    );
    assert!(stdout(&evaluated).contains("pass the recorded lookup\n"));
    assert!(
        stdout(&evaluated).contains("passing runs, per run: 2.0 turns, 1.0 calls, 301.0 tokens")
    );

    // Diverging: turn 1 now looks up another key, whose result the model was never
    // shown, so turn 2 is asked something the cassette does not have.
    let mut edited = cassette.clone();
    let arguments =
        &mut edited["turns"][0]["reply"]["decision"]["tool_calls"]["calls"][0]["arguments_json"];
    assert_eq!(*arguments, "{\"key\":\"profile\"}");
    *arguments = "{\"key\":\"policy\"}".into();
    std::fs::write(path.join("diverging.json"), edited.to_string()).unwrap();
    // And one that stops after its first turn.
    let mut short = cassette.clone();
    short["turns"].as_array_mut().unwrap().truncate(1);
    std::fs::write(path.join("short.json"), short.to_string()).unwrap();
    let (diverged, cut) = {
        let (path, base) = (path.clone(), base.clone());
        tokio::task::spawn_blocking(move || {
            (
                run(&path, &base, &["--cassette", "diverging.json"]),
                run(&path, &base, &["--cassette", "short.json"]),
            )
        })
        .await
        .unwrap()
    };
    assert_eq!(diverged["reason"], "model_error", "{diverged}");
    let detail = diverged["detail"].as_str().unwrap();
    assert!(
        detail.contains("the replay diverges at turn 2: the model is asked something else"),
        "{detail}"
    );
    assert_eq!(cut["reason"], "model_error", "{cut}");
    assert!(
        cut["detail"]
            .as_str()
            .unwrap()
            .contains("diverges at turn 2: the cassette has no decision for it"),
        "{cut}"
    );
    assert_eq!(
        server.received_requests().await.unwrap().len(),
        2,
        "still no model call"
    );

    // A case may name the real model instead, and price it: two requests more.
    std::fs::write(
        path.join("live.json"),
        json!({
            "name": "the live lookup",
            "goal": "Check the profile",
            "model": "openai:gpt-test",
            "price": [1.0, 2.0],
            "expect": {
                "reason": "completed",
                "trajectory": {"match": "exact", "calls": [{"name": "lookup"}]},
                "max_cost_usd": 0.001
            }
        })
        .to_string(),
    )
    .unwrap();
    let live = {
        let (path, base) = (path.clone(), base.clone());
        tokio::task::spawn_blocking(move || {
            agentloop(&path)
                .env("OPENAI_BASE_URL", base)
                .env("OPENAI_API_KEY", KEY)
                .args(["eval", "live.json", "--json"])
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    };
    let report: Value = serde_json::from_slice(&live.stdout)
        .unwrap_or_else(|_| panic!("{}{}", stdout(&live), stderr(&live)));
    assert_eq!(report["aggregate"]["passed"], 1, "{report:#}");
    // 280 input tokens at $1 and 21 output tokens at $2 per million.
    assert_eq!(report["runs"][0]["observed"]["cost_micro_usd"], 322);
    assert_eq!(server.received_requests().await.unwrap().len(), 4);
}
