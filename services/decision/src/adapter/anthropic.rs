//! Anthropic Messages: `tool_use` blocks out, `tool_result` blocks back by `tool_use_id`.

use agentloop_proto::v1::ToolDescriptor;
use serde_json::{Value, json};

use super::config::{AdapterDeps, EnvSource, ModelConfig, ModelConfigError, Provider, Settings};
use super::context::{self, Item, Prompt};
use super::{
    RawCall, cannot_continue, description, final_answer, invalid, reply, schema, tokens, tool_calls,
};
use crate::model::{Model, ModelError, ModelReply, Question};

/// The API version sent in `anthropic-version`.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Output-token cap when the configuration sets none (the API requires one).
pub const DEFAULT_ANTHROPIC_MAX_TOKENS: u32 = 4096;

/// The Anthropic adapter. Build it with [`crate::ModelConfig::build`].
#[derive(Debug)]
pub struct AnthropicModel {
    settings: Settings,
    endpoint: String,
}

impl AnthropicModel {
    /// The adapter for `config` (whose provider must be `anthropic`), reading the key and
    /// base URL from `env`.
    ///
    /// # Errors
    ///
    /// [`ModelConfigError`] when the configuration is incomplete or names another provider.
    pub fn from_config(
        config: &ModelConfig,
        env: &dyn EnvSource,
        deps: &AdapterDeps,
    ) -> Result<AnthropicModel, ModelConfigError> {
        if config.provider != Provider::Anthropic {
            return Err(ModelConfigError::WrongProvider("anthropic"));
        }
        Ok(AnthropicModel::new(config.resolve(env, deps)?))
    }

    pub(crate) fn new(settings: Settings) -> AnthropicModel {
        let endpoint = format!("{}/v1/messages", settings.base_url);
        AnthropicModel { settings, endpoint }
    }

    /// The Messages request body for `request` offering `tools`: what is sent, minus
    /// headers.
    pub fn request_body(&self, question: &Question<'_>, tools: &[ToolDescriptor]) -> Value {
        let prompt = context::build(question, &self.settings.context);
        let mut body = json!({
            "model": self.settings.model,
            "max_tokens": self.settings.max_tokens.unwrap_or(DEFAULT_ANTHROPIC_MAX_TOKENS),
            "system": prompt.system,
            "messages": messages(&prompt),
        });
        if !tools.is_empty() {
            body["tools"] = tools
                .iter()
                .map(|tool| {
                    json!({
                        "name": tool.name,
                        "description": description(tool),
                        "input_schema": schema(&tool.input_schema_json),
                    })
                })
                .collect();
        }
        body
    }
}

/// Appends blocks to the last message when it has the same role: the API wants
/// alternating roles, and tool results in the user message right after the tool uses.
fn push(out: &mut Vec<Value>, role: &str, blocks: Vec<Value>) {
    if let Some(last) = out.last_mut()
        && last["role"] == role
        && let Some(content) = last["content"].as_array_mut()
    {
        content.extend(blocks);
        return;
    }
    out.push(json!({"role": role, "content": blocks}));
}

fn messages(prompt: &Prompt) -> Vec<Value> {
    let mut out = Vec::with_capacity(prompt.items.len() + 1);
    for item in &prompt.items {
        match item {
            Item::User(text) => push(
                &mut out,
                "user",
                vec![json!({"type": "text", "text": text})],
            ),
            Item::Assistant(text) => {
                push(
                    &mut out,
                    "assistant",
                    vec![json!({"type": "text", "text": text})],
                );
            }
            Item::Calls {
                calls,
                observations,
            } => {
                let uses = calls
                    .iter()
                    .map(|c| {
                        // The API wants an object; committed arguments are JSON text.
                        let input = serde_json::from_str::<Value>(&c.arguments_json)
                            .ok()
                            .filter(Value::is_object)
                            .unwrap_or_else(|| json!({}));
                        json!({"type": "tool_use", "id": c.call_id, "name": c.tool, "input": input})
                    })
                    .collect();
                push(&mut out, "assistant", uses);
                let results = observations
                    .iter()
                    .map(|o| {
                        json!({"type": "tool_result", "tool_use_id": o.call_id,
                               "content": o.content, "is_error": o.is_error})
                    })
                    .collect();
                push(&mut out, "user", results);
            }
        }
    }
    out
}

pub(crate) fn parse(
    request: &Question<'_>,
    configured_model: &str,
    body: &Value,
) -> Result<ModelReply, ModelError> {
    let blocks = body
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| ModelError::Provider("malformed Messages response: no content".into()))?;
    let stop = body
        .get("stop_reason")
        .and_then(Value::as_str)
        .unwrap_or("");
    let text: String = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("");
    let uses: Vec<RawCall<'_>> = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
        .map(|b| RawCall {
            id: b.get("id").and_then(Value::as_str),
            name: b.get("name").and_then(Value::as_str),
            arguments: match b.get("input") {
                // Some compatible servers send the input as JSON text.
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => "{}".to_owned(),
                Some(
                    other
                    @ (Value::Bool(_) | Value::Number(_) | Value::Array(_) | Value::Object(_)),
                ) => other.to_string(),
            },
        })
        .collect();
    let outcome = if stop == "refusal" {
        cannot_continue(if text.trim().is_empty() {
            "the model refused"
        } else {
            &text
        })
    } else if stop == "max_tokens" {
        invalid("the output was cut off at max_tokens", &text)
    } else if !uses.is_empty() {
        tool_calls(request, &uses)
    } else {
        final_answer(&text).unwrap_or_else(|| {
            invalid(
                format!("no tool call and no text (stop_reason {stop:?})"),
                &text,
            )
        })
    };
    let usage = body.get("usage").unwrap_or(&Value::Null);
    let tokens = (
        tokens(usage, "input_tokens")
            + tokens(usage, "cache_creation_input_tokens")
            + tokens(usage, "cache_read_input_tokens"),
        tokens(usage, "output_tokens"),
    );
    Ok(reply(outcome, tokens, body, configured_model))
}

#[async_trait::async_trait]
impl Model for AnthropicModel {
    fn provider(&self) -> &'static str {
        "anthropic"
    }

    fn request_model(&self) -> &str {
        &self.settings.model
    }

    async fn decide_with(
        &self,
        request: &Question<'_>,
        tools: &[ToolDescriptor],
    ) -> Result<ModelReply, ModelError> {
        let body = self.request_body(request, tools);
        let mut headers = vec![("anthropic-version", ANTHROPIC_VERSION)];
        if let Some(key) = &self.settings.api_key {
            headers.push(("x-api-key", key.0.as_str()));
        }
        let response = self
            .settings
            .transport
            .post_json(&self.endpoint, &headers, &body)
            .await?;
        parse(request, &self.settings.model, &response)
    }
}
