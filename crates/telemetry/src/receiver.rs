//! An OTLP trace receiver in-process: the collector's `TraceService` over tonic, keeping
//! what it receives. The end-to-end tests assert on its spans; `agentloop bench`
//! exports to one that only counts, so traced throughput includes a real export.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tonic::{Request, Response, Status};

use crate::{Metrics, SamplerKind, Telemetry, TelemetryConfig, TraceError};

/// One received span, flattened: IDs as lowercase hex, attribute values as text.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// `service.name` of the resource that exported it.
    pub service: String,
    /// The trace ID.
    pub trace_id: String,
    /// The span ID.
    pub span_id: String,
    /// The parent's span ID; `None` for a root.
    pub parent_span_id: Option<String>,
    /// The span's name.
    pub name: String,
    /// `SpanKind` as OTLP numbers it (1 internal, 2 server, 3 client).
    pub kind: i32,
    /// The attributes.
    pub attributes: BTreeMap<String, String>,
    /// The linked spans, as (trace ID, span ID).
    pub links: Vec<(String, String)>,
    /// The status code (0 unset, 1 ok, 2 error).
    pub status: i32,
}

impl ReceivedSpan {
    /// The attribute `key`, if set.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Debug, Default)]
struct Received {
    spans: Mutex<Vec<ReceivedSpan>>,
    count: std::sync::atomic::AtomicU64,
    keep: bool,
    arrived: Notify,
}

/// A running receiver; dropping it stops it.
#[derive(Debug)]
pub struct OtlpReceiver {
    endpoint: String,
    received: Arc<Received>,
    _server: AbortOnDrop,
}

impl OtlpReceiver {
    /// A receiver on a free loopback port that keeps every span.
    ///
    /// # Errors
    ///
    /// When no port can be bound.
    pub async fn start() -> std::io::Result<OtlpReceiver> {
        OtlpReceiver::listen(true).await
    }

    /// A receiver that counts spans and keeps none (for the benchmark).
    ///
    /// # Errors
    ///
    /// When no port can be bound.
    pub async fn counting() -> std::io::Result<OtlpReceiver> {
        OtlpReceiver::listen(false).await
    }

    async fn listen(keep: bool) -> std::io::Result<OtlpReceiver> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let received = Arc::new(Received {
            keep,
            ..Received::default()
        });
        let service = TraceServiceServer::new(Collector(Arc::clone(&received)))
            .max_decoding_message_size(64 * 1024 * 1024);
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await;
        });
        Ok(OtlpReceiver {
            endpoint,
            received,
            _server: AbortOnDrop(server),
        })
    }

    /// `http://127.0.0.1:PORT`, for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Telemetry of `service` that exports every span here (sampled at 100%), its
    /// metrics into `metrics`, under the variables `env` (`OTEL_BSP_*`, say). Must run
    /// inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// When the exporter cannot be built or `env` holds an invalid value.
    pub fn telemetry(
        &self,
        service: &str,
        metrics: Metrics,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Telemetry, TraceError> {
        let config = TelemetryConfig {
            otlp_endpoint: Some(self.endpoint.clone()),
            sampler: Some(SamplerKind::AlwaysOn),
            ..TelemetryConfig::default()
        };
        let resolved = config.resolve(service, env).map_err(TraceError::Exporter)?;
        Telemetry::start(&resolved, metrics)
    }

    /// How many spans arrived.
    pub fn count(&self) -> u64 {
        self.received
            .count
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The spans kept so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received
            .spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until `done` holds for the spans kept, for at most `within`; the spans
    /// then (whether or not it held).
    pub async fn wait_until(
        &self,
        within: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let arrived = self.received.arrived.notified();
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return self.spans();
            }
        }
    }
}

struct Collector(Arc<Received>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let request = request.into_inner();
        let count: usize = request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|scope| scope.spans.len())
            .sum();
        // Counting only (the bench) converts nothing, so the receiver costs what
        // decoding the spans costs, as a collector elsewhere would.
        if self.0.keep {
            let flat = flatten(request);
            self.0
                .spans
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(flat);
        }
        self.0.count.fetch_add(
            u64::try_from(count).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.0.arrived.notify_waiters();
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// Every span of `request`, flattened.
fn flatten(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut flat = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
            .map(value_of)
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                flat.push(ReceivedSpan {
                    service: service.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: (!span.parent_span_id.is_empty())
                        .then(|| hex(&span.parent_span_id)),
                    name: span.name,
                    kind: span.kind,
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), value_of(kv)))
                        .collect(),
                    links: span
                        .links
                        .iter()
                        .map(|link| (hex(&link.trace_id), hex(&link.span_id)))
                        .collect(),
                    status: span.status.map(|s| s.code).unwrap_or_default(),
                });
            }
        }
    }
    flat
}

fn value_of(kv: &KeyValue) -> String {
    match kv
        .value
        .as_ref()
        .and_then(|AnyValue { value }| value.as_ref())
    {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Aborts the server task with the receiver.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
