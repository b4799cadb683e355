//! A service binary's telemetry as an operator configures it: the standard `OTEL_*`
//! variables send its spans to a collector (a real OTLP receiver here), `metrics_listen`
//! serves `/metrics`, `AGENTLOOP_LOG_FORMAT=json` writes JSON lines, and SIGTERM
//! exports what is still buffered before the process exits.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Stdio;
use std::time::Duration;

use agentloop_proto::v1 as pb;
use agentloop_telemetry::metrics::sample;
use agentloop_telemetry::receiver::OtlpReceiver;
use agentloop_telemetry::scrape;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Two free loopback ports (bound, read, released).
fn free_ports() -> (String, String) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (
        a.local_addr().unwrap().to_string(),
        b.local_addr().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exports_spans_serves_metrics_and_logs_json() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let (listen, metrics) = free_ports();
    let data = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentloop-ledger"))
        .env_clear()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment.name=test",
        )
        .env("AGENTLOOP_LOG_FORMAT", "json")
        .env("AGENTLOOP_LEDGER_METRICS_LISTEN", &metrics)
        .args(["--listen", &listen, "--data-dir"])
        .arg(data.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Every line is JSON; the start is over at "listening".
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let started = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let line: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            if line["message"] == "listening" {
                return line;
            }
        }
        panic!("the ledger exited before listening");
    })
    .await
    .expect("the ledger did not start");
    assert_eq!(started["level"], "INFO");
    // Drain the rest of its log, so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let transport = agentloop_proto::client::connect(
        &format!("http://{listen}"),
        agentloop_proto::client::ClientConfig::default(),
    )
    .await
    .unwrap();
    let mut ledger = agentloop_proto::client::effect_ledger(transport);
    let missing = ledger
        .get(pb::GetRequest {
            effect_key: "0".repeat(64),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    ledger
        .prepare(pb::PrepareRequest {
            invocation_id: "inv".into(),
            call_id: "call".into(),
            effect_key: "1".repeat(64),
            tool: "crm.update".into(),
        })
        .await
        .unwrap();

    let scraped = scrape::get(&metrics).await.unwrap();
    assert_eq!(
        sample(
            &scraped,
            "agentloop_rpc_responses_total{service=\"agentloop.v1.EffectLedgerService\",code=\"NOT_FOUND\"}"
        ),
        Some(1.0),
        "{scraped}"
    );
    assert_eq!(
        sample(
            &scraped,
            "agentloop_effect_transitions_total{state=\"prepared\"}"
        ),
        Some(1.0),
        "{scraped}"
    );
    // Counted in the database, at start and on a period.
    assert!(
        sample(&scraped, "agentloop_effects_unresolved{state=\"prepared\"}").is_some(),
        "{scraped}"
    );

    // SIGTERM: the ledger drains, exports its buffered spans and exits 0.
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the ledger did not stop")
        .unwrap();
    assert!(status.success(), "{status}");
    let spans = receiver
        .wait_until(Duration::from_secs(10), |spans| {
            spans.iter().any(|s| s.name.ends_with("/Get"))
        })
        .await;
    let get = spans
        .iter()
        .find(|s| s.name == "agentloop.v1.EffectLedgerService/Get")
        .unwrap_or_else(|| panic!("no span of the Get: {spans:#?}"));
    assert_eq!(get.service, "agentloop-ledger");
    assert_eq!(get.attribute("rpc.grpc.status_code"), Some("5"));
}
