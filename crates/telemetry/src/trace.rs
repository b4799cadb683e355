//! Spans: the tracer of one service, its spans, and W3C trace context on gRPC metadata.
//!
//! agentloop uses the OpenTelemetry API directly, not through `tracing`: a service with
//! traces off holds no tracer, so an operation pays one branch and nothing else; with
//! traces on, a span is built once, by the SDK, without a second representation. The
//! context travels as OpenTelemetry's own: a span's [`Context`] is attached to the
//! future that does its work ([`ActiveSpan::scope`]), and [`inject`] copies the current
//! one onto an outgoing call.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::Either;
use opentelemetry::context::FutureExt as _;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{
    Link, SpanContext, SpanKind, Status, TraceContextExt, Tracer, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
    SpanProcessor,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tonic::codegen::http::HeaderMap;

use crate::Metrics;
use crate::config::{Protocol, Resolved, SamplerKind};

/// Whether any tracer exists in this process: while none does, [`inject`] and
/// [`extract`] return at once.
static TRACING: AtomicBool = AtomicBool::new(false);

/// The spans of one service, and where they go. `None` inside: traces are off.
#[derive(Clone, Default)]
pub(crate) struct Spans {
    tracer: Option<SdkTracer>,
    provider: Option<SdkTracerProvider>,
}

impl std::fmt::Debug for Spans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spans")
            .field("on", &self.tracer.is_some())
            .finish()
    }
}

/// Why traces cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The exporter could not be built from the configuration.
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
}

impl Spans {
    /// A tracer exporting to `resolved.endpoint`, or none; what it ends and exports is
    /// counted in `metrics`. Must run inside a tokio runtime: the batch processor is a
    /// task on it.
    pub(crate) fn start(resolved: &Resolved, metrics: &Metrics) -> Result<Spans, TraceError> {
        let Some(endpoint) = &resolved.endpoint else {
            return Ok(Spans::default());
        };
        let exporter = match resolved.protocol {
            Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .with_timeout(resolved.timeout)
                .build(),
            Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(endpoint.clone())
                .with_timeout(resolved.timeout)
                .build(),
        }
        .map_err(|e| TraceError::Exporter(e.to_string()))?;
        let exporter = Counted {
            inner: exporter,
            exported: metrics.counters(
                "spans_exported",
                "Spans handed to the exporter, by outcome; those ended but never handed were dropped because the queue was full.",
            ),
        };
        // The other `OTEL_BSP_*` variables are read by the SDK itself.
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(resolved.max_queued_spans)
            .with_max_concurrent_exports(resolved.max_concurrent_exports)
            .build();
        let processor = Counting {
            inner: BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio)
                .with_batch_config(batch)
                .build(),
            ended: metrics.counter(
                "spans_ended",
                "Sampled spans that ended and were queued for export.",
            ),
        };
        let (kind, ratio) = resolved.sampler;
        let sampler = match kind {
            SamplerKind::AlwaysOn => Sampler::AlwaysOn,
            SamplerKind::AlwaysOff => Sampler::AlwaysOff,
            SamplerKind::Traceidratio => Sampler::TraceIdRatioBased(ratio),
            SamplerKind::ParentbasedAlwaysOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
            SamplerKind::ParentbasedAlwaysOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
            SamplerKind::ParentbasedTraceidratio => {
                Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio)))
            }
        };
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(resolved.service_name.clone())
            .with_attributes(
                [
                    KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                    KeyValue::new("telemetry.sdk.language", "rust"),
                    KeyValue::new("telemetry.sdk.name", "opentelemetry"),
                ]
                .into_iter()
                .chain(
                    resolved
                        .resource_attributes
                        .iter()
                        .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
                ),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("agentloop");
        TRACING.store(true, Ordering::Relaxed);
        Ok(Spans {
            tracer: Some(tracer),
            provider: Some(provider),
        })
    }

    pub(crate) fn on(&self) -> bool {
        self.tracer.is_some()
    }

    /// A span, child of `parent` (the current context when `None`), from what `what`
    /// returns; nothing at all while traces are off.
    pub(crate) fn start_span(
        &self,
        kind: SpanKind,
        parent: Option<&Context>,
        what: impl FnOnce() -> SpanStart,
    ) -> ActiveSpan {
        let Some(tracer) = &self.tracer else {
            return ActiveSpan(None);
        };
        let SpanStart {
            name,
            attributes,
            links,
        } = what();
        let builder = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .with_links(links);
        let span = match parent {
            Some(parent) => tracer.build_with_context(builder, parent),
            None => Context::map_current(|current| tracer.build_with_context(builder, current)),
        };
        let parent_cx = parent.cloned().unwrap_or_else(Context::current);
        ActiveSpan(Some(Arc::new(parent_cx.with_span(span))))
    }

    /// Exports what is buffered. Blocks: call it from a blocking thread.
    pub(crate) fn flush(&self) {
        if let Some(provider) = &self.provider {
            let _ = provider.force_flush();
        }
    }

    /// Exports what is buffered and stops exporting. Blocks, like [`Spans::flush`].
    pub(crate) fn shutdown(&self) {
        if let Some(provider) = &self.provider {
            let _ = provider.shutdown();
        }
    }
}

/// Counts the sampled spans that end, then queues them.
#[derive(Debug)]
struct Counting<P> {
    inner: P,
    ended: Counter,
}

impl<P: SpanProcessor> SpanProcessor for Counting<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if span.span_context.is_sampled() {
            self.ended.inc();
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// Labels of `agentloop_spans_exported_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Exported {
    outcome: &'static str,
}

/// Counts the spans of every batch by the outcome of its export.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    exported: Family<Exported, Counter>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        let result = self.inner.export(batch).await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        self.exported
            .get_or_create(&Exported { outcome })
            .inc_by(spans);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// What a span starts with.
#[derive(Debug, Default)]
pub struct SpanStart {
    /// Its name (`chat gpt-4o`, `execute_tool transfer`).
    pub name: Cow<'static, str>,
    /// Its attributes at start.
    pub attributes: Vec<KeyValue>,
    /// Spans it continues (a resumed invocation's earlier one).
    pub links: Vec<Link>,
}

impl SpanStart {
    /// A span named `name` with `attributes`.
    pub fn new(name: impl Into<Cow<'static, str>>, attributes: Vec<KeyValue>) -> SpanStart {
        SpanStart {
            name: name.into(),
            attributes,
            links: Vec::new(),
        }
    }

    /// The same, linked to `linked`.
    #[must_use]
    pub fn linked(mut self, linked: SpanContext) -> SpanStart {
        self.links.push(Link::with_context(linked));
        self
    }
}

/// A started span (or nothing, with traces off): its context, which its work runs in.
/// The span ends when [`ActiveSpan::end`] is called or the last clone of its context
/// is dropped.
#[derive(Debug, Clone, Default)]
pub struct ActiveSpan(Option<Arc<Context>>);

impl ActiveSpan {
    /// No span.
    pub fn none() -> ActiveSpan {
        ActiveSpan(None)
    }

    /// Whether there is a span that records.
    pub fn is_recording(&self) -> bool {
        self.0.as_ref().is_some_and(|cx| cx.span().is_recording())
    }

    /// Sets the attributes `what` returns (called only when the span records).
    pub fn set(&self, what: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(cx) = &self.0
            && cx.span().is_recording()
        {
            cx.span().set_attributes(what());
        }
    }

    /// Marks the span failed: `error.type` and an error status with `message`.
    pub fn fail(&self, error_type: &'static str, message: impl FnOnce() -> String) {
        if let Some(cx) = &self.0
            && cx.span().is_recording()
        {
            let span = cx.span();
            span.set_attribute(KeyValue::new(crate::semconv::ERROR_TYPE, error_type));
            span.set_status(Status::error(message()));
        }
    }

    /// Ends the span now.
    pub fn end(&self) {
        if let Some(cx) = &self.0 {
            cx.span().end();
        }
    }

    /// The span's context, to start children under.
    pub fn context(&self) -> Option<&Context> {
        self.0.as_deref()
    }

    /// The span's IDs (invalid without a span).
    pub fn span_context(&self) -> SpanContext {
        self.0
            .as_ref()
            .map(|cx| cx.span().span_context().clone())
            .unwrap_or_else(SpanContext::empty_context)
    }

    /// `future`, run with this span current: the spans it starts are its children and
    /// the calls it makes carry it. Without a span, `future` as it is.
    pub fn scope<F: Future>(&self, future: F) -> Either<opentelemetry::context::WithContext<F>, F> {
        match &self.0 {
            Some(cx) => Either::Left(future.with_context(Context::clone(cx))),
            None => Either::Right(future),
        }
    }

    /// [`ActiveSpan::scope`], boxed: without a span, the box holds `future` alone, so
    /// an operation that is kept while it waits costs nothing more with traces off.
    pub fn boxed<'a, T>(
        &self,
        future: impl Future<Output = T> + Send + 'a,
    ) -> std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>> {
        match &self.0 {
            Some(cx) => Box::pin(future.with_context(Context::clone(cx))),
            None => Box::pin(future),
        }
    }

    /// Runs `f` with this span current.
    pub fn enter<T>(&self, f: impl FnOnce() -> T) -> T {
        match &self.0 {
            Some(cx) => {
                let _guard = Context::clone(cx).attach();
                f()
            }
            None => f(),
        }
    }
}

/// W3C `traceparent` of `span` (`00-<trace>-<span>-<flags>`), to store and continue
/// later; `None` for an invalid one.
pub fn traceparent(span: &SpanContext) -> Option<String> {
    span.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            span.trace_id(),
            span.span_id(),
            span.trace_flags().to_u8()
        )
    })
}

/// The span a stored `traceparent` names, as a remote parent.
pub fn parse_traceparent(traceparent: &str) -> Option<SpanContext> {
    let mut headers = HeaderMap::new();
    headers.insert("traceparent", traceparent.parse().ok()?);
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(&headers));
    let span = cx.span().span_context().clone();
    span.is_valid().then_some(span)
}

/// Copies the current trace context onto `headers` (`traceparent`, `tracestate`).
pub fn inject(headers: &mut HeaderMap) {
    if !TRACING.load(Ordering::Relaxed) {
        return;
    }
    Context::map_current(|cx| {
        if cx.span().span_context().is_valid() {
            TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
        }
    });
}

/// The caller's trace context in `headers`, if any (and if this process traces).
pub fn extract(headers: &HeaderMap) -> Option<Context> {
    if !TRACING.load(Ordering::Relaxed) || !headers.contains_key("traceparent") {
        return None;
    }
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    cx.span().span_context().is_valid().then_some(cx)
}

/// The trace and span IDs of the current context, for log lines.
pub(crate) fn current_ids() -> Option<(String, String)> {
    if !TRACING.load(Ordering::Relaxed) {
        return None;
    }
    Context::map_current(|cx| {
        let span = cx.span();
        let ids = span.span_context();
        ids.is_valid()
            .then(|| (ids.trace_id().to_string(), ids.span_id().to_string()))
    })
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            tonic::codegen::http::HeaderName::from_bytes(key.as_bytes()),
            tonic::codegen::http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::SpanKind;

    use crate::config::{SamplerKind, TelemetryConfig};
    use crate::metrics::sample;
    use crate::{Metrics, SpanStart, Telemetry};

    /// A queue of two on a single-threaded runtime: while the test ends ten spans
    /// without yielding, the batch task cannot take any, so at most the queue's worth
    /// is handed over and the rest dropped. The collector is a closed port, so what is
    /// handed over fails to export.
    #[tokio::test(flavor = "current_thread")]
    async fn spans_past_a_full_queue_are_dropped_and_what_is_handed_over_is_counted() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let config = TelemetryConfig {
            otlp_endpoint: Some(endpoint),
            sampler: Some(SamplerKind::AlwaysOn),
            max_queued_spans: Some(2),
            ..TelemetryConfig::default()
        };
        let metrics = Metrics::new();
        let telemetry = Telemetry::start(
            &config.resolve("test", Vec::new()).unwrap(),
            metrics.clone(),
        )
        .unwrap();
        for _ in 0..10 {
            telemetry
                .span(SpanKind::Internal, || SpanStart::new("work", Vec::new()))
                .end();
        }
        // The batch task takes what was queued and fails to export it; the shutdown
        // waits behind that export (and ends the provider off this runtime's thread,
        // which a drop here would block).
        tokio::task::yield_now().await;
        telemetry.shutdown().await;

        let text = metrics.encode();
        assert_eq!(
            sample(&text, "agentloop_spans_ended_total"),
            Some(10.0),
            "{text}"
        );
        // The queue's two places, and the SDK channel's place per sender at most.
        let handed = sample(&text, "agentloop_spans_exported_total{outcome=\"error\"}");
        assert!(handed.is_some_and(|n| (1.0..=3.0).contains(&n)), "{text}");
        assert_eq!(
            sample(&text, "agentloop_spans_exported_total{outcome=\"ok\"}"),
            None
        );
    }
}
