//! Prometheus metrics: one registry per service, and the `/metrics` endpoint that serves
//! it in the OpenMetrics text format.
//!
//! Every metric is named `agentloop_*` and registered here by the service that records
//! it. Labels are drawn from closed sets (terminal reasons, gRPC codes, outcomes) or
//! from configuration (models, registered tools), never from requests: an invocation ID
//! or a caller's text never becomes a label, so a scrape stays the same size however
//! much runs.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Buckets of durations, in seconds: 1 ms to about 2 minutes.
pub const SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
/// Buckets of long durations (whole invocations), in seconds: 10 ms to 6 hours.
pub const LONG_SECONDS: &[f64] = &[
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0,
];
/// Buckets of sizes (events in a commit, invocations in a group).
pub const SIZES: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// A histogram over [`SECONDS`].
pub fn seconds() -> Histogram {
    Histogram::new(SECONDS.iter().copied())
}

/// A histogram over [`LONG_SECONDS`].
pub fn long_seconds() -> Histogram {
    Histogram::new(LONG_SECONDS.iter().copied())
}

/// A histogram over [`SIZES`].
pub fn sizes() -> Histogram {
    Histogram::new(SIZES.iter().copied())
}

/// A family of histograms, each built by a plain function ([`seconds`], [`sizes`]).
pub type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

/// The metrics of one service (or, embedded, of all of them), cheap to clone.
///
/// Registering a name twice returns the metric registered first, so two parts of one
/// process that record the same metric (two servers of the embedded stack) share it
/// instead of printing it twice.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    registry: Registry,
    registered: HashMap<String, Box<dyn Any + Send>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            inner: Arc::new(Mutex::new(Inner {
                registry: Registry::with_prefix("agentloop"),
                registered: HashMap::new(),
            })),
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// `agentloop_<name>`, registered with `help`, built by `make` the first time.
    pub fn register<M>(&self, name: &str, help: &str, make: impl FnOnce() -> M) -> M
    where
        M: Metric + Clone + Send + 'static,
    {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(existing) = inner
            .registered
            .get(name)
            .and_then(|m| m.downcast_ref::<M>())
        {
            return existing.clone();
        }
        let metric = make();
        inner.registry.register(name, help, metric.clone());
        inner
            .registered
            .insert(name.to_owned(), Box::new(metric.clone()));
        metric
    }

    /// A counter (`agentloop_<name>_total`).
    pub fn counter(&self, name: &str, help: &str) -> Counter {
        self.register(name, help, Counter::default)
    }

    /// A counter with labels `S`.
    pub fn counters<S>(&self, name: &str, help: &str) -> Family<S, Counter>
    where
        S: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
    {
        self.register(name, help, Family::default)
    }

    /// A counter of fractional amounts (dollars) with labels `S`.
    pub fn float_counters<S>(
        &self,
        name: &str,
        help: &str,
    ) -> Family<S, Counter<f64, std::sync::atomic::AtomicU64>>
    where
        S: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
    {
        self.register(name, help, Family::default)
    }

    /// A gauge.
    pub fn gauge(&self, name: &str, help: &str) -> Gauge {
        self.register(name, help, Gauge::default)
    }

    /// A gauge with labels `S`.
    pub fn gauges<S>(&self, name: &str, help: &str) -> Family<S, Gauge>
    where
        S: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
    {
        self.register(name, help, Family::default)
    }

    /// A histogram built by `buckets` ([`seconds`], [`long_seconds`], [`sizes`]).
    pub fn histogram(&self, name: &str, help: &str, buckets: fn() -> Histogram) -> Histogram {
        self.register(name, help, buckets)
    }

    /// Histograms with labels `S`, each built by `buckets`.
    pub fn histograms<S>(
        &self,
        name: &str,
        help: &str,
        buckets: fn() -> Histogram,
    ) -> HistogramFamily<S>
    where
        S: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
    {
        self.register(name, help, || Family::new_with_constructor(buckets))
    }

    /// The registry in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &inner.registry);
        text
    }
}

/// The value of the sample `series` (`name{labels}` as the text format prints it) in
/// `text` (what [`Metrics::encode`] or a scrape returns); `None` when there is no such
/// sample.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Every sample in `text`, by series; comments and malformed lines are skipped.
pub fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// The content type of [`Metrics::encode`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Connections the endpoint serves at once; more wait for one to close.
const MAX_CONNECTIONS: usize = 16;
/// Longest time a scraper may take to send its request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `metrics` on `listener` (`GET /metrics`; anything else is 404 or 405) until
/// `shutdown` resolves. The endpoint shows counts and durations only: no identifiers,
/// no content, no secrets.
///
/// # Errors
///
/// When accepting connections fails for good.
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => return Ok(()),
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return Ok(()),
            },
        };
        let (stream, _) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // A connection that failed before it was accepted (reset, too many open
                // files for a moment) is the peer's problem or a passing one.
                Err(error) if is_transient(&error) => continue,
                Err(error) => return Err(error),
            },
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                std::future::ready(Ok::<_, Infallible>(respond(&metrics, &request)))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            drop(permit);
        });
    }
}

/// `EMFILE` and `ENFILE` (Linux): too many open files in the process or the system,
/// which passes as connections close. The standard library has no kind for them.
const TOO_MANY_OPEN_FILES: [i32; 2] = [24, 23];

fn is_transient(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
            | ErrorKind::Interrupted
            | ErrorKind::WouldBlock
    ) || error
        .raw_os_error()
        .is_some_and(|errno| TOO_MANY_OPEN_FILES.contains(&errno))
}

fn respond(metrics: &Metrics, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let status = |status: StatusCode| {
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = status;
        response
    };
    if request.uri().path() != "/metrics" {
        return status(StatusCode::NOT_FOUND);
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return status(StatusCode::METHOD_NOT_ALLOWED);
    }
    let mut response = Response::new(Full::new(Bytes::from(metrics.encode())));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(CONTENT_TYPE),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP agentloop_x X.\n# TYPE agentloop_x counter\n\
        agentloop_x_total 3\nagentloop_x_total{code=\"OK\"} 2.5\nagentloop_x_created 1.7e9\n# EOF\n";

    #[test]
    fn a_series_is_matched_whole() {
        assert_eq!(sample(TEXT, "agentloop_x_total"), Some(3.0));
        assert_eq!(sample(TEXT, "agentloop_x_total{code=\"OK\"}"), Some(2.5));
        assert_eq!(sample(TEXT, "agentloop_x"), None);
        assert_eq!(sample(TEXT, "agentloop_y_total"), None);
    }

    #[test]
    fn samples_skip_comments() {
        let all = samples(TEXT);
        assert_eq!(all.len(), 3, "{all:?}");
        assert_eq!(all["agentloop_x_created"], 1.7e9);
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Reason {
        reason: &'static str,
    }

    #[test]
    fn a_name_registered_twice_is_one_metric() {
        let metrics = Metrics::new();
        let first = metrics.counters::<Reason>("runs_ended", "Runs ended.");
        let second = metrics.counters::<Reason>("runs_ended", "Runs ended.");
        first
            .get_or_create(&Reason {
                reason: "completed",
            })
            .inc();
        second
            .get_or_create(&Reason {
                reason: "completed",
            })
            .inc();
        let text = metrics.encode();
        assert_eq!(
            text.matches("# TYPE agentloop_runs_ended counter").count(),
            1
        );
        assert!(
            text.contains("agentloop_runs_ended_total{reason=\"completed\"} 2"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn the_endpoint_serves_the_registry_and_nothing_else() {
        let metrics = Metrics::new();
        metrics.counter("scrapes_seen", "Test.").inc_by(3);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let stop = tokio_util_free_token();
        let server = tokio::spawn(serve(listener, metrics, stop.1));
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
            let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            response
        };
        let scraped = get("/metrics").await;
        assert!(scraped.starts_with("HTTP/1.1 200"), "{scraped}");
        assert!(scraped.contains(CONTENT_TYPE), "{scraped}");
        assert!(
            scraped.contains("agentloop_scrapes_seen_total 3"),
            "{scraped}"
        );
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        let _ = stop.0.send(());
        server.await.unwrap().unwrap();
    }

    /// A shutdown future and its trigger, without another dependency.
    fn tokio_util_free_token() -> (
        tokio::sync::oneshot::Sender<()>,
        impl Future<Output = ()> + Send,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        (tx, async move {
            let _ = rx.await;
        })
    }
}
