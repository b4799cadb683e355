//! What the decision service records of each model call: a `chat {model}` span (the
//! OpenTelemetry GenAI conventions) and the model metrics, labelled by provider and the
//! configured model, both closed sets (the configuration names them).

use std::sync::Arc;
use std::time::Instant;

use agentloop_proto::v1::ToolDescriptor;
use agentloop_telemetry::metrics::{HistogramFamily, seconds};
use agentloop_telemetry::prometheus_client::encoding::EncodeLabelSet;
use agentloop_telemetry::prometheus_client::metrics::counter::Counter;
use agentloop_telemetry::prometheus_client::metrics::family::Family;
use agentloop_telemetry::semconv::{
    GEN_AI_OPERATION_NAME, GEN_AI_PROVIDER_NAME, GEN_AI_REQUEST_MODEL, GEN_AI_RESPONSE_MODEL,
    GEN_AI_USAGE_INPUT_TOKENS, GEN_AI_USAGE_OUTPUT_TOKENS, INVOCATION_ID, OP_CHAT, TURN,
};
use agentloop_telemetry::{KeyValue, SpanKind, SpanStart, Telemetry};

use crate::model::{Model, ModelError, ModelReply, Question};

/// A model call's labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Called {
    provider: &'static str,
    model: Arc<str>,
    outcome: &'static str,
}

/// Tokens' labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Tokens {
    provider: &'static str,
    model: Arc<str>,
    r#type: &'static str,
}

/// Cost's labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Priced {
    provider: &'static str,
    model: Arc<str>,
}

/// The service's telemetry and its model metrics.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    telemetry: Telemetry,
    seconds: HistogramFamily<Called>,
    tokens: Family<Tokens, Counter>,
    cost: Family<Priced, Counter<f64, std::sync::atomic::AtomicU64>>,
}

impl Recorded {
    pub(crate) fn new(telemetry: Telemetry) -> Recorded {
        let m = telemetry.metrics();
        Recorded {
            seconds: m.histograms(
                "model_call_duration_seconds",
                "Model calls by provider, configured model and outcome (ok, error).",
                seconds,
            ),
            tokens: m.counters(
                "model_tokens",
                "Tokens by provider, configured model and type (input, output).",
            ),
            cost: m.float_counters(
                "model_cost_usd",
                "What priced model calls cost, in US dollars, by provider and configured model.",
            ),
            telemetry,
        }
    }

    /// Asks `model`, under a `chat {model}` span, and counts the call.
    pub(crate) async fn chat(
        &self,
        model: &dyn Model,
        request: &Question<'_>,
        tools: &[ToolDescriptor],
    ) -> Result<ModelReply, ModelError> {
        let (provider, name) = (model.provider(), model.request_model());
        let span = self.telemetry.span(SpanKind::Client, || {
            SpanStart::new(
                format!("{OP_CHAT} {name}"),
                vec![
                    KeyValue::new(GEN_AI_OPERATION_NAME, OP_CHAT),
                    KeyValue::new(GEN_AI_PROVIDER_NAME, provider),
                    KeyValue::new(GEN_AI_REQUEST_MODEL, name.to_owned()),
                    KeyValue::new(INVOCATION_ID, request.invocation_id.to_owned()),
                    KeyValue::new(TURN, i64::from(request.turn)),
                ],
            )
        });
        let began = Instant::now();
        let reply = span.scope(model.decide_with(request, tools)).await;
        let outcome = if reply.is_ok() { "ok" } else { "error" };
        // One copy of the name serves every label set of the call.
        let label: Arc<str> = Arc::from(name);
        self.seconds
            .get_or_create(&Called {
                provider,
                model: Arc::clone(&label),
                outcome,
            })
            .observe(began.elapsed().as_secs_f64());
        match &reply {
            Ok(reply) => {
                let usage = &reply.usage;
                for (kind, count) in [
                    ("input", usage.input_tokens),
                    ("output", usage.output_tokens),
                ] {
                    self.tokens
                        .get_or_create(&Tokens {
                            provider,
                            model: Arc::clone(&label),
                            r#type: kind,
                        })
                        .inc_by(count);
                }
                if let Some(agentloop_engine::MicroUsd(micro)) = usage.cost {
                    self.cost
                        .get_or_create(&Priced {
                            provider,
                            model: label,
                        })
                        .inc_by(micro as f64 / 1_000_000.0);
                }
                span.set(|| {
                    vec![
                        KeyValue::new(GEN_AI_RESPONSE_MODEL, reply.model.clone()),
                        KeyValue::new(
                            GEN_AI_USAGE_INPUT_TOKENS,
                            i64::try_from(usage.input_tokens).unwrap_or(i64::MAX),
                        ),
                        KeyValue::new(
                            GEN_AI_USAGE_OUTPUT_TOKENS,
                            i64::try_from(usage.output_tokens).unwrap_or(i64::MAX),
                        ),
                    ]
                });
            }
            Err(error) => span.fail("model_error", || error.to_string()),
        }
        span.end();
        reply
    }
}
