//! What every server records: a server span that continues the caller's W3C trace
//! context, exported over OTLP to a real (in-process) receiver; the answers counted by
//! code on `/metrics`; and JSON log lines that carry the trace and span IDs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop_server::{ServiceSet, serve};
use agentloop_telemetry::receiver::{OtlpReceiver, ReceivedSpan};
use agentloop_telemetry::{KeyValue, Metrics, SpanKind, SpanStart};
use agentloop_telemetry::{metrics, scrape};
use tokio::net::TcpListener;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_continues_the_callers_trace_and_is_counted_by_code() {
    agentloop_server::install_crypto_provider();
    let receiver = OtlpReceiver::start().await.unwrap();
    let server_metrics = Metrics::new();
    let server_telemetry = receiver
        .telemetry("test-server", server_metrics.clone(), [])
        .unwrap();
    let client_telemetry = receiver
        .telemetry("test-client", Metrics::new(), [])
        .unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        ServiceSet::new().telemetry(&server_telemetry),
        async move {
            let _ = stopped.await;
        },
    ));
    let metrics_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_address = metrics_listener.local_addr().unwrap();
    tokio::spawn(agentloop_telemetry::metrics::serve(
        metrics_listener,
        server_metrics,
        std::future::pending(),
    ));

    let transport = agentloop_proto::client::connect(
        &endpoint,
        agentloop_proto::client::ClientConfig::default(),
    )
    .await
    .unwrap();
    let mut health = HealthClient::new(transport);
    // A call inside a client span, and one whose service health does not know
    // (NOT_FOUND), outside any span.
    let parent = client_telemetry.span(SpanKind::Client, || {
        SpanStart::new("check health", vec![KeyValue::new("test.case", "parent")])
    });
    let served = parent
        .scope(health.check(HealthCheckRequest {
            service: String::new(),
        }))
        .await
        .unwrap();
    assert_eq!(served.into_inner().status, 1, "SERVING");
    parent.end();
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    // A JSON log line inside the span carries its IDs.
    let lines = Arc::new(Mutex::new(Vec::<u8>::new()));
    let writer = {
        let lines = Arc::clone(&lines);
        move || Captured(Arc::clone(&lines))
    };
    let subscriber = tracing_subscriber::fmt()
        .event_format(agentloop_telemetry::log::JsonLines)
        .with_writer(writer)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        parent.enter(|| tracing::info!("inside the parent"));
        tracing::info!("outside any span");
    });
    let logged: Vec<serde_json::Value> = String::from_utf8(lines.lock().unwrap().clone())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let ids = parent.span_context();
    assert_eq!(logged[0]["trace_id"], ids.trace_id().to_string());
    assert_eq!(logged[0]["span_id"], ids.span_id().to_string());
    assert!(logged[1].get("trace_id").is_none(), "{}", logged[1]);

    client_telemetry.flush().await;
    server_telemetry.flush().await;
    let spans = receiver
        .wait_until(Duration::from_secs(30), |spans| {
            spans.iter().filter(|s| s.service == "test-server").count() >= 2
                && spans.iter().any(|s| s.service == "test-client")
        })
        .await;
    let client: &ReceivedSpan = spans
        .iter()
        .find(|s| s.service == "test-client")
        .expect("the client span");
    let continued = spans
        .iter()
        .find(|s| s.service == "test-server" && s.trace_id == client.trace_id)
        .unwrap_or_else(|| panic!("no server span in the client's trace: {spans:#?}"));
    assert_eq!(continued.parent_span_id.as_ref(), Some(&client.span_id));
    assert_eq!(continued.name, "grpc.health.v1.Health/Check");
    assert_eq!(continued.kind, 2, "SERVER");
    assert_eq!(continued.attribute("rpc.system"), Some("grpc"));
    assert_eq!(
        continued.attribute("rpc.service"),
        Some("grpc.health.v1.Health")
    );
    assert_eq!(continued.attribute("rpc.grpc.status_code"), Some("0"));
    // The call made outside any span is a root of its own trace.
    let root = spans
        .iter()
        .find(|s| s.service == "test-server" && s.trace_id != client.trace_id)
        .expect("the second call's span");
    assert_eq!(root.parent_span_id, None);
    assert_eq!(root.attribute("rpc.grpc.status_code"), Some("5"));

    let scraped = metrics::samples(&scrape::get(&metrics_address.to_string()).await.unwrap());
    let count = |code: &str| {
        scraped
            .get(&format!(
                "agentloop_rpc_responses_total{{service=\"grpc.health.v1.Health\",code=\"{code}\"}}"
            ))
            .copied()
    };
    assert_eq!(count("OK"), Some(1.0), "{scraped:#?}");
    assert_eq!(count("NOT_FOUND"), Some(1.0), "{scraped:#?}");
    // The server ended two spans and exported both (its flush waited for the export).
    assert_eq!(scraped.get("agentloop_spans_ended_total"), Some(&2.0));
    assert_eq!(
        scraped.get("agentloop_spans_exported_total{outcome=\"ok\"}"),
        Some(&2.0),
        "{scraped:#?}"
    );

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
