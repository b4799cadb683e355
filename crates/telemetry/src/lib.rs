//! Telemetry of agentloop: traces, metrics and the log, set up the same way by every
//! service.
//!
//! - [`Telemetry`] is one service's handle: its tracer (none while traces are off), its
//!   [`Metrics`] registry, and the [`ContentPolicy`] that says what content may go on a
//!   span. Each service records through the handle it was built with, so the services of
//!   one process (the distributed stack in a test) still export under their own
//!   `service.name` and serve their own `/metrics`.
//! - [`inject`] and [`extract`] carry W3C trace context over gRPC metadata; the client
//!   transport and the shared server call them, so every hop continues the trace.
//! - [`semconv`] holds every span and attribute name; [`config`] the `[telemetry]`
//!   section and the standard `OTEL_*` variables; [`log`] the text and JSON log lines.
//!
//! It knows nothing of agentloop's contracts: the services decide what to record.

#![warn(missing_docs)]

pub mod config;
pub mod content;
pub mod log;
pub mod metrics;
#[cfg(feature = "testing")]
pub mod receiver;
#[cfg(feature = "testing")]
pub mod scrape;
pub mod semconv;
mod trace;

use std::sync::Arc;

pub use config::{LogFormat, Protocol, SamplerKind, TelemetryConfig};
pub use content::ContentPolicy;
pub use metrics::Metrics;
pub use opentelemetry::trace::{SpanContext, SpanKind};
pub use opentelemetry::{Context, KeyValue};
pub use prometheus_client;
pub use trace::{
    ActiveSpan, SpanStart, TraceError, extract, inject, parse_traceparent, traceparent,
};

/// One service's telemetry; cheap to clone. [`Telemetry::default`] records metrics and
/// exports nothing.
#[derive(Debug, Clone, Default)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    spans: trace::Spans,
    metrics: Metrics,
    content: ContentPolicy,
}

impl Telemetry {
    /// Metrics into a fresh registry, no traces, no content.
    pub fn off() -> Telemetry {
        Telemetry::default()
    }

    /// The telemetry `resolved` describes, its metrics into `metrics`. With an endpoint,
    /// spans are batched and exported by a task on the current tokio runtime (so this
    /// must run inside one).
    ///
    /// # Errors
    ///
    /// When the exporter cannot be built.
    pub fn start(resolved: &config::Resolved, metrics: Metrics) -> Result<Telemetry, TraceError> {
        Ok(Telemetry {
            inner: Arc::new(Inner {
                spans: trace::Spans::start(resolved, &metrics)?,
                metrics,
                content: resolved.content.clone(),
            }),
        })
    }

    /// Whether spans are exported.
    pub fn traces(&self) -> bool {
        self.inner.spans.on()
    }

    /// Starts a span of `kind` under the current context; `what` runs only when traces
    /// are on.
    pub fn span(&self, kind: SpanKind, what: impl FnOnce() -> SpanStart) -> ActiveSpan {
        self.inner.spans.start_span(kind, None, what)
    }

    /// Starts a span of `kind` under `parent`.
    pub fn span_under(
        &self,
        kind: SpanKind,
        parent: &Context,
        what: impl FnOnce() -> SpanStart,
    ) -> ActiveSpan {
        self.inner.spans.start_span(kind, Some(parent), what)
    }

    /// Starts a span of `kind` that continues `earlier` (a span that ended in another
    /// process or an earlier life of this one, named by its stored `traceparent`): its
    /// child, so that both are one trace, and linked to it.
    pub fn span_after(
        &self,
        kind: SpanKind,
        earlier: SpanContext,
        what: impl FnOnce() -> SpanStart,
    ) -> ActiveSpan {
        use opentelemetry::trace::TraceContextExt as _;
        let parent = Context::new().with_remote_span_context(earlier.clone());
        self.inner
            .spans
            .start_span(kind, Some(&parent), || what().linked(earlier))
    }

    /// The service's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// What content may be recorded.
    pub fn content(&self) -> &ContentPolicy {
        &self.inner.content
    }

    /// Exports the spans buffered so far (waits for the export).
    pub async fn flush(&self) {
        if self.traces() {
            let spans = self.inner.spans.clone();
            let _ = tokio::task::spawn_blocking(move || spans.flush()).await;
        }
    }

    /// Exports what is buffered and stops exporting (at the end of a process).
    pub async fn shutdown(&self) {
        if self.traces() {
            let spans = self.inner.spans.clone();
            let _ = tokio::task::spawn_blocking(move || spans.shutdown()).await;
        }
    }
}
