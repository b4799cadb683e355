//! What every server records of every RPC: a server span that continues the caller's
//! trace (W3C `traceparent` in the metadata), and the count of answers by service and
//! gRPC code (`agentloop_rpc_responses_total`), whose non-OK codes are the refusals.

use std::sync::Arc;
use std::task::{Context, Poll};

use agentloop_telemetry::prometheus_client::encoding::EncodeLabelSet;
use agentloop_telemetry::prometheus_client::metrics::counter::Counter;
use agentloop_telemetry::prometheus_client::metrics::family::Family;
use agentloop_telemetry::semconv::{RPC_GRPC_STATUS_CODE, RPC_METHOD, RPC_SERVICE, RPC_SYSTEM};
use agentloop_telemetry::{KeyValue, SpanKind, SpanStart, Telemetry};
use futures::future::BoxFuture;
use tonic::codegen::http::{Request, Response};
use tower::{Layer, Service};

/// Labels of `agentloop_rpc_responses_total`: both from closed sets (the services this
/// process serves, or `other`; the seventeen gRPC codes).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Answered {
    service: &'static str,
    code: &'static str,
}

/// The layer [`crate::serve`] puts in front of every service it serves.
#[derive(Clone)]
pub(crate) struct Observe {
    telemetry: Telemetry,
    responses: Family<Answered, Counter>,
    /// The fully-qualified names of the services served, the only `service` labels.
    names: Arc<[&'static str]>,
}

impl Observe {
    pub(crate) fn new(telemetry: Telemetry, names: Vec<&'static str>) -> Observe {
        let responses = telemetry.metrics().counters(
            "rpc_responses",
            "gRPC answers by service and status code; every code but OK is a refusal or a failure.",
        );
        Observe {
            telemetry,
            responses,
            names: names.into(),
        }
    }
}

impl<S> Layer<S> for Observe {
    type Service = Observed<S>;

    fn layer(&self, inner: S) -> Observed<S> {
        Observed {
            inner,
            observe: self.clone(),
        }
    }
}

/// One service behind what [`crate::serve`] records of each RPC ([`crate::observed`]).
#[derive(Clone)]
pub struct Observed<S> {
    inner: S,
    observe: Observe,
}

impl<S> std::fmt::Debug for Observed<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed")
            .field("services", &self.observe.names)
            .finish_non_exhaustive()
    }
}

impl<S, B, R> Service<Request<B>> for Observed<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let path = request.uri().path();
        let (service, method) = path
            .trim_start_matches('/')
            .split_once('/')
            .unwrap_or(("", ""));
        let service: &'static str = self
            .observe
            .names
            .iter()
            .copied()
            .find(|name| *name == service)
            .unwrap_or("other");
        let span = match agentloop_telemetry::extract(request.headers()) {
            Some(parent) => self
                .observe
                .telemetry
                .span_under(SpanKind::Server, &parent, || server_span(service, method)),
            None => self
                .observe
                .telemetry
                .span(SpanKind::Server, || server_span(service, method)),
        };
        let future = span.enter(|| self.inner.call(request));
        let responses = self.observe.responses.clone();
        Box::pin(async move {
            let response = span.scope(future).await?;
            let code = response
                .headers()
                .get("grpc-status")
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse::<i32>().ok())
                .unwrap_or(0);
            responses
                .get_or_create(&Answered {
                    service,
                    code: code_name(code),
                })
                .inc();
            span.set(|| vec![KeyValue::new(RPC_GRPC_STATUS_CODE, i64::from(code))]);
            if code != 0 && !caller_error(code) {
                span.fail(code_name(code), || {
                    format!("gRPC status {}", code_name(code))
                });
            }
            span.end();
            Ok(response)
        })
    }
}

/// The server span of `service`/`method`, named as the RPC conventions say
/// (`agentloop.v1.DecisionService/Decide`).
fn server_span(service: &'static str, method: &str) -> SpanStart {
    // The method is the caller's text: bounded before it goes on a span.
    let method: String = method.chars().take(64).collect();
    SpanStart::new(
        format!("{service}/{method}"),
        vec![
            KeyValue::new(RPC_SYSTEM, "grpc"),
            KeyValue::new(RPC_SERVICE, service),
            KeyValue::new(RPC_METHOD, method),
        ],
    )
}

/// Codes that report the caller's mistake or a normal outcome, not the server failing
/// (the same set the log does not count as errors).
fn caller_error(code: i32) -> bool {
    matches!(code, 1 | 3 | 5 | 6 | 9 | 11 | 12 | 16 | 7)
}

/// The name of a gRPC status code, as the label and `error.type` carry it.
fn code_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        15 => "DATA_LOSS",
        16 => "UNAUTHENTICATED",
        _ => "UNKNOWN",
    }
}
