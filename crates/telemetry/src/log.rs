//! The process's log: text lines by default, or JSON lines that carry the `trace_id`
//! and `span_id` of the operation that logged them, so a log shipper can join them to
//! the trace.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::LogFormat;

/// Installs the global log subscriber: `RUST_LOG` syntax (default `default_filter`),
/// `format`'s lines on stdout. Later calls (and calls after a test harness installed a
/// subscriber) do nothing and return `false`.
pub fn init(format: LogFormat, default_filter: &str) -> bool {
    use tracing_subscriber::EnvFilter;

    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.try_init().is_ok(),
        LogFormat::Json => builder.event_format(JsonLines).try_init().is_ok(),
    }
}

/// One JSON object per event: `timestamp` (RFC 3339, UTC), `level`, `target`, the
/// event's fields (`message` among them), the names of the `tracing` spans it is in,
/// and `trace_id` / `span_id` when it was logged inside a traced operation.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = json_line(event);
        if let Some(scope) = ctx.event_scope() {
            let spans: Vec<Value> = scope
                .from_root()
                .map(|span| Value::String(span.name().to_owned()))
                .collect();
            if !spans.is_empty() {
                line.insert("spans".into(), Value::Array(spans));
            }
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// The JSON object of `event`, with the current trace context's IDs.
fn json_line(event: &Event<'_>) -> Map<String, Value> {
    let metadata = event.metadata();
    let mut line = Map::new();
    line.insert("timestamp".into(), Value::String(timestamp()));
    line.insert("level".into(), Value::String(metadata.level().to_string()));
    line.insert("target".into(), Value::String(metadata.target().to_owned()));
    let mut fields = Fields(Map::new());
    event.record(&mut fields);
    for (key, value) in fields.0 {
        line.insert(key, value);
    }
    if let Some((trace_id, span_id)) = crate::trace::current_ids() {
        line.insert("trace_id".into(), Value::String(trace_id));
        line.insert("span_id".into(), Value::String(span_id));
    }
    line
}

struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_owned()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), Value::Bool(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
}

/// Now as RFC 3339 UTC with microseconds.
fn timestamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (year, month, day) = civil(i64::try_from(secs / 86_400).unwrap_or(0));
    let rem = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60,
        now.subsec_micros()
    )
}

/// The civil date of a day count since 1970-01-01, without a date library (Howard
/// Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
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

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    #[test]
    fn a_line_is_one_json_object_with_the_fields() {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .event_format(JsonLines)
            .with_writer(captured.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("resume");
            let _entered = span.enter();
            tracing::warn!(invocation = "abc", steps = 3_u64, "run ended");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["message"], "run ended");
        assert_eq!(line["invocation"], "abc");
        assert_eq!(line["steps"], 3);
        assert_eq!(line["spans"][0], "resume");
        let timestamp = line["timestamp"].as_str().unwrap();
        assert!(
            timestamp.starts_with("20") && timestamp.ends_with('Z'),
            "{timestamp}"
        );
    }

    #[test]
    fn days_are_civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(20_789), (2026, 12, 2));
        assert_eq!(civil(11_016), (2000, 2, 29));
    }
}
