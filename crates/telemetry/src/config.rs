//! The `[telemetry]` section every service configuration has, and how the standard
//! OpenTelemetry environment variables fill in what it leaves unset.
//!
//! A key set in the configuration (file, `AGENTLOOP_<SERVICE>_TELEMETRY__*`) wins; the
//! `OTEL_*` variables an OpenTelemetry operator or a platform injects fill in the rest;
//! then the defaults: no export, text logs, no content.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `OTEL_EXPORTER_OTLP_ENDPOINT`: the collector's base address.
pub const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: the traces address, used as given.
pub const OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// `OTEL_EXPORTER_OTLP_PROTOCOL`: `grpc` or `http/protobuf`.
pub const OTEL_EXPORTER_OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
/// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`: the protocol of traces alone.
pub const OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
/// `OTEL_SERVICE_NAME`: the `service.name` resource attribute.
pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// `OTEL_TRACES_SAMPLER`: which spans are kept.
pub const OTEL_TRACES_SAMPLER: &str = "OTEL_TRACES_SAMPLER";
/// `OTEL_TRACES_SAMPLER_ARG`: the ratio of the `*traceidratio` samplers.
pub const OTEL_TRACES_SAMPLER_ARG: &str = "OTEL_TRACES_SAMPLER_ARG";
/// `OTEL_RESOURCE_ATTRIBUTES`: `key=value,key=value`, values percent-encoded.
pub const OTEL_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
/// `OTEL_SDK_DISABLED`: `true` turns traces off whatever else is set.
pub const OTEL_SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
/// `OTEL_BSP_MAX_QUEUE_SIZE`: the most ended spans waiting for export.
pub const OTEL_BSP_MAX_QUEUE_SIZE: &str = "OTEL_BSP_MAX_QUEUE_SIZE";
/// `OTEL_BSP_MAX_CONCURRENT_EXPORTS`: the most exports in flight at once.
pub const OTEL_BSP_MAX_CONCURRENT_EXPORTS: &str = "OTEL_BSP_MAX_CONCURRENT_EXPORTS";

/// The most resource attributes a configuration may name (they go on every export).
pub const MAX_RESOURCE_ATTRIBUTES: usize = 64;
/// The most keys [`TelemetryConfig::redact_keys`] may hold.
pub const MAX_REDACT_KEYS: usize = 256;
/// The largest [`TelemetryConfig::max_content_bytes`].
pub const MAX_CONTENT_BYTES: usize = 64 * 1024;
/// [`TelemetryConfig::max_queued_spans`] by default: about 100 ms of the spans of a
/// process committing 20,000 turns/s, a few tens of MiB at most.
pub const DEFAULT_QUEUED_SPANS: usize = 65_536;
/// [`TelemetryConfig::max_concurrent_exports`] by default. One export at a time (the
/// SDK's default) caps a process at one collector round trip per batch of 512 spans,
/// which `agentloop bench --traces` outran at a few thousand turns/s.
pub const DEFAULT_CONCURRENT_EXPORTS: usize = 4;
/// The largest [`TelemetryConfig::max_concurrent_exports`].
pub const MAX_CONCURRENT_EXPORTS: usize = 64;
/// The largest [`TelemetryConfig::max_queued_spans`]: a queued span holds its attributes
/// (a few hundred bytes to a few kilobytes), so this bounds the memory of a collector
/// that stops answering.
pub const MAX_QUEUED_SPANS: usize = 1 << 20;

/// How spans reach the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Protocol {
    /// OTLP over gRPC (the collector's port 4317).
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318, path `/v1/traces`).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

impl Protocol {
    fn parse(value: &str) -> Result<Protocol, String> {
        match value.trim() {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            other => Err(format!(
                "unknown OTLP protocol {other:?} (grpc or http/protobuf; http/json is not supported)"
            )),
        }
    }
}

/// The log's line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line, with `trace_id` and `span_id` inside a traced operation.
    Json,
}

/// Which spans are kept, as `OTEL_TRACES_SAMPLER` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplerKind {
    /// Every span.
    AlwaysOn,
    /// None.
    AlwaysOff,
    /// A ratio of traces, by trace ID ([`TelemetryConfig::sampler_arg`]).
    Traceidratio,
    /// As the caller decided; every root (the default).
    ParentbasedAlwaysOn,
    /// As the caller decided; no root.
    ParentbasedAlwaysOff,
    /// As the caller decided; a ratio of roots.
    ParentbasedTraceidratio,
}

impl SamplerKind {
    fn parse(value: &str) -> Result<SamplerKind, String> {
        Ok(match value.trim() {
            "always_on" => SamplerKind::AlwaysOn,
            "always_off" => SamplerKind::AlwaysOff,
            "traceidratio" => SamplerKind::Traceidratio,
            "parentbased_always_on" => SamplerKind::ParentbasedAlwaysOn,
            "parentbased_always_off" => SamplerKind::ParentbasedAlwaysOff,
            "parentbased_traceidratio" => SamplerKind::ParentbasedTraceidratio,
            other => return Err(format!("unknown sampler {other:?}")),
        })
    }
}

/// The `[telemetry]` section of a service configuration. Every key is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's OTLP address, e.g. `http://otel-collector:4317`
    /// (`OTEL_EXPORTER_OTLP_ENDPOINT`). Unset: no spans leave the process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// `grpc` (default) or `http/protobuf` (`OTEL_EXPORTER_OTLP_PROTOCOL`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_protocol: Option<Protocol>,
    /// The longest an export may take, in milliseconds (default 10000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_timeout_ms: Option<u64>,
    /// The most ended spans waiting for export (`OTEL_BSP_MAX_QUEUE_SIZE`); past it,
    /// spans are dropped and counted as such. Default [`DEFAULT_QUEUED_SPANS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queued_spans: Option<usize>,
    /// The most exports in flight at once (`OTEL_BSP_MAX_CONCURRENT_EXPORTS`). Default
    /// [`DEFAULT_CONCURRENT_EXPORTS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_exports: Option<usize>,
    /// `service.name` (`OTEL_SERVICE_NAME`); default: the binary's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// `OTEL_TRACES_SAMPLER`; default `parentbased_always_on`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampler: Option<SamplerKind>,
    /// The ratio of the `*traceidratio` samplers, 0 to 1 (`OTEL_TRACES_SAMPLER_ARG`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampler_arg: Option<f64>,
    /// Resource attributes added to every span (`OTEL_RESOURCE_ATTRIBUTES`, which fills
    /// in the keys not named here).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub resource_attributes: BTreeMap<String, String>,
    /// Record content (goals, tool arguments and outputs, answers) on spans. Off by
    /// default: content may hold personal data.
    pub record_content: bool,
    /// Keys of JSON content whose values are replaced by `REDACTED` when content is
    /// recorded (compared without case; added to the built-in secret keys).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub redact_keys: Vec<String>,
    /// The most bytes of one recorded content value (default 4096, at most 65536).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_content_bytes: Option<usize>,
    /// `text` (default) or `json` (`AGENTLOOP_LOG_FORMAT`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
}

// The one float, `sampler_arg`, is a ratio that `resolve` refuses unless it lies in
// 0..=1, so NaN never reaches a running service; services compare configurations whole.
impl Eq for TelemetryConfig {}

/// The variable that selects the log format when the configuration does not.
pub const LOG_FORMAT_ENV: &str = "AGENTLOOP_LOG_FORMAT";

/// A [`TelemetryConfig`] with the environment applied and the defaults chosen: what
/// [`crate::Telemetry::start`] builds from.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// Where to export traces (the full traces URL for HTTP); `None`: traces off.
    pub endpoint: Option<String>,
    /// How.
    pub protocol: Protocol,
    /// Longest export.
    pub timeout: Duration,
    /// The most spans waiting for export.
    pub max_queued_spans: usize,
    /// The most exports in flight.
    pub max_concurrent_exports: usize,
    /// `service.name`.
    pub service_name: String,
    /// The sampler and its ratio.
    pub sampler: (SamplerKind, f64),
    /// Every resource attribute but `service.name`.
    pub resource_attributes: BTreeMap<String, String>,
    /// Whether content is recorded, under which redactions, how long.
    pub content: crate::content::ContentPolicy,
    /// The log format.
    pub log_format: LogFormat,
}

impl TelemetryConfig {
    /// Applies `env` (the process environment, passed in for tests) and the defaults
    /// for the binary `service`.
    ///
    /// # Errors
    ///
    /// A message naming the key or variable that is invalid: an unknown protocol or
    /// sampler, a ratio outside 0 to 1, an endpoint that is not an `http(s)://` URL, a
    /// malformed `OTEL_RESOURCE_ATTRIBUTES`, or a bound exceeded.
    pub fn resolve(
        &self,
        service: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Resolved, String> {
        let env: BTreeMap<String, String> = env
            .into_iter()
            .filter(|(key, value)| {
                (key.starts_with("OTEL_") || key == LOG_FORMAT_ENV) && !value.trim().is_empty()
            })
            .collect();
        let var = |name: &str| env.get(name).map(|v| v.trim().to_owned());
        let disabled = var(OTEL_SDK_DISABLED).is_some_and(|v| v.eq_ignore_ascii_case("true"));

        let protocol = match self.otlp_protocol {
            Some(protocol) => protocol,
            None => match var(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
                .or_else(|| var(OTEL_EXPORTER_OTLP_PROTOCOL))
            {
                Some(value) => Protocol::parse(&value)?,
                None => Protocol::Grpc,
            },
        };
        // The generic endpoint is a base address: HTTP appends the signal's path; the
        // traces endpoint is used as given (the OTLP exporter specification).
        let endpoint = match &self.otlp_endpoint {
            Some(base) => Some(traces_url(base, protocol)),
            None => match var(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) {
                Some(url) => Some(url),
                None => var(OTEL_EXPORTER_OTLP_ENDPOINT).map(|base| traces_url(&base, protocol)),
            },
        }
        .filter(|_| !disabled);
        if let Some(url) = &endpoint
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(format!(
                "telemetry.otlp_endpoint: {url:?} is not an http:// or https:// URL"
            ));
        }
        let sampler = match self.sampler {
            Some(kind) => kind,
            None => match var(OTEL_TRACES_SAMPLER) {
                Some(value) => {
                    SamplerKind::parse(&value).map_err(|e| format!("{OTEL_TRACES_SAMPLER}: {e}"))?
                }
                None => SamplerKind::ParentbasedAlwaysOn,
            },
        };
        let ratio = match self.sampler_arg {
            Some(ratio) => ratio,
            None => match var(OTEL_TRACES_SAMPLER_ARG) {
                Some(value) => value
                    .parse::<f64>()
                    .map_err(|_| format!("{OTEL_TRACES_SAMPLER_ARG}: {value:?} is not a number"))?,
                None => 1.0,
            },
        };
        if !(0.0..=1.0).contains(&ratio) {
            return Err(format!(
                "telemetry.sampler_arg: {ratio} is not a ratio between 0 and 1"
            ));
        }
        let mut resource_attributes = self.resource_attributes.clone();
        if let Some(list) = var(OTEL_RESOURCE_ATTRIBUTES) {
            for (key, value) in parse_resource_attributes(&list)? {
                resource_attributes.entry(key).or_insert(value);
            }
        }
        let service_name = self
            .service_name
            .clone()
            .or_else(|| var(OTEL_SERVICE_NAME))
            .or_else(|| resource_attributes.get("service.name").cloned())
            .unwrap_or_else(|| service.to_owned());
        resource_attributes.remove("service.name");
        if resource_attributes.len() > MAX_RESOURCE_ATTRIBUTES {
            return Err(format!(
                "telemetry.resource_attributes: {} attributes, at most {MAX_RESOURCE_ATTRIBUTES}",
                resource_attributes.len()
            ));
        }
        if self.redact_keys.len() > MAX_REDACT_KEYS {
            return Err(format!(
                "telemetry.redact_keys: {} keys, at most {MAX_REDACT_KEYS}",
                self.redact_keys.len()
            ));
        }
        let max_bytes = self
            .max_content_bytes
            .unwrap_or(crate::content::DEFAULT_CONTENT_BYTES);
        if max_bytes > MAX_CONTENT_BYTES {
            return Err(format!(
                "telemetry.max_content_bytes: {max_bytes}, at most {MAX_CONTENT_BYTES}"
            ));
        }
        // A count from the configuration, else its variable, else the default; 1..=max.
        let count = |configured: Option<usize>, key: &str, name: &str, default, max| {
            let count = match configured {
                Some(count) => count,
                None => match var(name) {
                    Some(value) => value
                        .parse::<usize>()
                        .map_err(|_| format!("{name}: {value:?} is not a number"))?,
                    None => default,
                },
            };
            if (1..=max).contains(&count) {
                Ok(count)
            } else {
                Err(format!("telemetry.{key}: {count}, from 1 to {max}"))
            }
        };
        let max_queued_spans = count(
            self.max_queued_spans,
            "max_queued_spans",
            OTEL_BSP_MAX_QUEUE_SIZE,
            DEFAULT_QUEUED_SPANS,
            MAX_QUEUED_SPANS,
        )?;
        let max_concurrent_exports = count(
            self.max_concurrent_exports,
            "max_concurrent_exports",
            OTEL_BSP_MAX_CONCURRENT_EXPORTS,
            DEFAULT_CONCURRENT_EXPORTS,
            MAX_CONCURRENT_EXPORTS,
        )?;
        let log_format = match self.log_format {
            Some(format) => format,
            None if var(LOG_FORMAT_ENV).is_some_and(|v| v.eq_ignore_ascii_case("json")) => {
                LogFormat::Json
            }
            None => LogFormat::Text,
        };
        Ok(Resolved {
            endpoint,
            protocol,
            timeout: Duration::from_millis(self.otlp_timeout_ms.unwrap_or(10_000)),
            max_queued_spans,
            max_concurrent_exports,
            service_name,
            sampler: (sampler, ratio),
            resource_attributes,
            content: crate::content::ContentPolicy::new(
                self.record_content,
                &self.redact_keys,
                max_bytes,
            ),
            log_format,
        })
    }
}

/// The traces URL of a base endpoint: as given for gRPC; `/v1/traces` appended for HTTP.
fn traces_url(base: &str, protocol: Protocol) -> String {
    let base = base.trim();
    match protocol {
        Protocol::Grpc => base.to_owned(),
        Protocol::HttpProtobuf => format!("{}/v1/traces", base.trim_end_matches('/')),
    }
}

/// `key=value,key=value` (W3C baggage-like; values percent-decoded).
fn parse_resource_attributes(list: &str) -> Result<Vec<(String, String)>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("{OTEL_RESOURCE_ATTRIBUTES}: {pair:?} is not key=value"))?;
            let key = key.trim();
            if key.is_empty() {
                return Err(format!(
                    "{OTEL_RESOURCE_ATTRIBUTES}: an empty key in {pair:?}"
                ));
            }
            Ok((key.to_owned(), percent_decode(value.trim())))
        })
        .collect()
}

fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (byte, hex) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                i += 3;
            }
            _ => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn nothing_configured_means_no_export_and_text_logs() {
        let resolved = TelemetryConfig::default()
            .resolve("agentloop-ledger", env(&[]))
            .unwrap();
        assert_eq!(resolved.endpoint, None);
        assert_eq!(resolved.service_name, "agentloop-ledger");
        assert_eq!(resolved.log_format, LogFormat::Text);
        assert_eq!(resolved.max_queued_spans, DEFAULT_QUEUED_SPANS);
        assert_eq!(resolved.max_concurrent_exports, DEFAULT_CONCURRENT_EXPORTS);
        assert!(!resolved.content.records());
    }

    #[test]
    fn the_standard_variables_fill_in_what_the_configuration_leaves_unset() {
        let vars = env(&[
            (OTEL_EXPORTER_OTLP_ENDPOINT, "http://collector:4318/"),
            (OTEL_EXPORTER_OTLP_PROTOCOL, "http/protobuf"),
            (OTEL_SERVICE_NAME, "orders-agent"),
            (OTEL_TRACES_SAMPLER, "parentbased_traceidratio"),
            (OTEL_TRACES_SAMPLER_ARG, "0.25"),
            (OTEL_BSP_MAX_QUEUE_SIZE, "50000"),
            (OTEL_BSP_MAX_CONCURRENT_EXPORTS, "8"),
            (
                OTEL_RESOURCE_ATTRIBUTES,
                "deployment.environment.name=prod,team=a%2Cb",
            ),
        ]);
        let resolved = TelemetryConfig::default()
            .resolve("agentloop-orchestrator", vars.clone())
            .unwrap();
        assert_eq!(
            resolved.endpoint.as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(resolved.protocol, Protocol::HttpProtobuf);
        assert_eq!(resolved.service_name, "orders-agent");
        assert_eq!(
            resolved.sampler,
            (SamplerKind::ParentbasedTraceidratio, 0.25)
        );
        assert_eq!(resolved.resource_attributes["team"], "a,b");
        assert_eq!(resolved.max_queued_spans, 50_000);
        assert_eq!(resolved.max_concurrent_exports, 8);

        let configured = TelemetryConfig {
            otlp_endpoint: Some("http://other:4317".into()),
            otlp_protocol: Some(Protocol::Grpc),
            service_name: Some("mine".into()),
            resource_attributes: BTreeMap::from([("team".into(), "c".into())]),
            max_queued_spans: Some(100),
            max_concurrent_exports: Some(2),
            ..TelemetryConfig::default()
        }
        .resolve("agentloop-orchestrator", vars)
        .unwrap();
        assert_eq!(configured.max_queued_spans, 100);
        assert_eq!(configured.max_concurrent_exports, 2);
        assert_eq!(configured.endpoint.as_deref(), Some("http://other:4317"));
        assert_eq!(configured.service_name, "mine");
        assert_eq!(configured.resource_attributes["team"], "c");
        assert_eq!(
            configured.resource_attributes["deployment.environment.name"],
            "prod"
        );
    }

    #[test]
    fn the_sdk_can_be_disabled_and_bad_values_are_named() {
        let off = TelemetryConfig::default()
            .resolve(
                "x",
                env(&[
                    (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4317"),
                    (OTEL_SDK_DISABLED, "true"),
                ]),
            )
            .unwrap();
        assert_eq!(off.endpoint, None);
        for (vars, named) in [
            (
                vec![(OTEL_EXPORTER_OTLP_PROTOCOL, "http/json")],
                "http/json",
            ),
            (vec![(OTEL_TRACES_SAMPLER, "sometimes")], "sometimes"),
            (vec![(OTEL_TRACES_SAMPLER_ARG, "2")], "sampler_arg"),
            (vec![(OTEL_RESOURCE_ATTRIBUTES, "novalue")], "novalue"),
            (vec![(OTEL_BSP_MAX_QUEUE_SIZE, "many")], "many"),
            (vec![(OTEL_BSP_MAX_QUEUE_SIZE, "0")], "max_queued_spans"),
            (
                vec![(OTEL_BSP_MAX_CONCURRENT_EXPORTS, "65")],
                "max_concurrent_exports",
            ),
            (
                vec![(OTEL_EXPORTER_OTLP_ENDPOINT, "collector:4317")],
                "http://",
            ),
        ] {
            let error = TelemetryConfig::default()
                .resolve("x", env(&vars))
                .unwrap_err();
            assert!(error.contains(named), "{error}");
        }
    }
}
