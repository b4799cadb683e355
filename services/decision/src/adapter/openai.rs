//! OpenAI Chat Completions (and every server that speaks it): function tools,
//! parallel `tool_calls`, results as `tool` messages by `tool_call_id`.

use agentloop_proto::v1::ToolDescriptor;
use serde_json::{Value, json};

use super::config::{AdapterDeps, EnvSource, ModelConfig, ModelConfigError, Provider, Settings};
use super::context::{self, Item, Prompt};
use super::{
    RawCall, cannot_continue, description, final_answer, invalid, reply, schema, tokens, tool_calls,
};
use crate::model::{Model, ModelError, ModelReply, Question};

/// The OpenAI-compatible adapter. Build it with [`crate::ModelConfig::build`].
#[derive(Debug)]
pub struct OpenAiModel {
    settings: Settings,
    endpoint: String,
}

impl OpenAiModel {
    /// The adapter for `config` (whose provider must be `openai`), reading the key and
    /// base URL from `env`.
    ///
    /// # Errors
    ///
    /// [`ModelConfigError`] when the configuration is incomplete or names another provider.
    pub fn from_config(
        config: &ModelConfig,
        env: &dyn EnvSource,
        deps: &AdapterDeps,
    ) -> Result<OpenAiModel, ModelConfigError> {
        if config.provider != Provider::Openai {
            return Err(ModelConfigError::WrongProvider("openai"));
        }
        Ok(OpenAiModel::new(config.resolve(env, deps)?))
    }

    pub(crate) fn new(settings: Settings) -> OpenAiModel {
        let endpoint = format!("{}/chat/completions", settings.base_url);
        OpenAiModel { settings, endpoint }
    }

    /// The Chat Completions request body for `request` offering `tools`: what is sent,
    /// minus headers.
    /// Public for benchmarks and diagnosis.
    pub fn request_body(&self, question: &Question<'_>, tools: &[ToolDescriptor]) -> Value {
        let prompt = context::build(question, &self.settings.context);
        let mut body = json!({
            "model": self.settings.model,
            "messages": messages(&prompt),
        });
        if !tools.is_empty() {
            body["tools"] = tools
                .iter()
                .map(|tool| {
                    json!({"type": "function", "function": {
                        "name": tool.name,
                        "description": description(tool),
                        "parameters": schema(&tool.input_schema_json),
                    }})
                })
                .collect();
        }
        if let Some(max_tokens) = self.settings.max_tokens {
            body["max_tokens"] = json!(max_tokens);
        }
        body
    }
}

fn messages(prompt: &Prompt) -> Vec<Value> {
    let mut out = vec![json!({"role": "system", "content": prompt.system})];
    for item in &prompt.items {
        match item {
            Item::User(text) => out.push(json!({"role": "user", "content": text})),
            Item::Assistant(text) => out.push(json!({"role": "assistant", "content": text})),
            Item::Calls {
                calls,
                observations,
            } => {
                let tool_calls: Vec<Value> = calls
                    .iter()
                    .map(|c| {
                        json!({"id": c.call_id, "type": "function",
                               "function": {"name": c.tool, "arguments": c.arguments_json}})
                    })
                    .collect();
                out.push(json!({"role": "assistant", "content": null, "tool_calls": tool_calls}));
                for o in observations {
                    out.push(
                        json!({"role": "tool", "tool_call_id": o.call_id, "content": o.content}),
                    );
                }
            }
        }
    }
    out
}

/// The text of `content`: a string, or an array of parts with `text`.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::Object(_) => String::new(),
    }
}

pub(crate) fn parse(
    request: &Question<'_>,
    configured_model: &str,
    body: &Value,
) -> Result<ModelReply, ModelError> {
    let choice = body.get("choices").and_then(|c| c.get(0)).ok_or_else(|| {
        ModelError::Provider("malformed Chat Completions response: no choices".into())
    })?;
    let message = choice.get("message").unwrap_or(&Value::Null);
    let finish = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .unwrap_or("");
    let refusal = message
        .get("refusal")
        .and_then(Value::as_str)
        .filter(|r| !r.trim().is_empty());
    let calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty());
    let text = text_of(message.get("content").unwrap_or(&Value::Null));
    let outcome = if let Some(refusal) = refusal {
        cannot_continue(refusal)
    } else if finish == "content_filter" {
        cannot_continue("the provider's content filter stopped the output")
    } else if let Some(calls) = calls {
        let raw: Vec<RawCall<'_>> = calls
            .iter()
            .map(|call| {
                let function = call.get("function").unwrap_or(&Value::Null);
                let arguments = match function.get("arguments") {
                    Some(Value::String(s)) if s.trim().is_empty() => "{}".to_owned(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Null) | None => "{}".to_owned(),
                    Some(
                        other @ (Value::Bool(_)
                        | Value::Number(_)
                        | Value::Array(_)
                        | Value::Object(_)),
                    ) => other.to_string(),
                };
                RawCall {
                    id: call.get("id").and_then(Value::as_str),
                    name: function.get("name").and_then(Value::as_str),
                    arguments,
                }
            })
            .collect();
        tool_calls(request, &raw)
    } else if finish == "length" {
        invalid("the output was cut off at max_tokens", &text)
    } else {
        final_answer(&text).unwrap_or_else(|| {
            invalid(
                format!("no tool call and no text (finish_reason {finish:?})"),
                &text,
            )
        })
    };
    let usage = body.get("usage").unwrap_or(&Value::Null);
    let tokens = (
        tokens(usage, "prompt_tokens"),
        tokens(usage, "completion_tokens"),
    );
    Ok(reply(outcome, tokens, body, configured_model))
}

#[async_trait::async_trait]
impl Model for OpenAiModel {
    fn provider(&self) -> &'static str {
        "openai"
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
        let auth = self
            .settings
            .api_key
            .as_ref()
            .map(|key| format!("Bearer {}", key.0));
        let mut headers = Vec::with_capacity(1);
        if let Some(auth) = &auth {
            headers.push(("authorization", auth.as_str()));
        }
        let response = self
            .settings
            .transport
            .post_json(&self.endpoint, &headers, &body)
            .await?;
        parse(request, &self.settings.model, &response)
    }
}
