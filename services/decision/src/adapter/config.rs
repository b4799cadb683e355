//! Per-profile model configuration, where API keys come from, and the spec form
//! (`openai:MODEL`) the command line uses.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::anthropic::AnthropicModel;
use super::context::ContextConfig;
use super::http::{RetryPolicy, Sleeper, TokioSleeper, Transport};
use super::openai::OpenAiModel;
use crate::model::Model;

/// Which adapter a profile uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// The offline scripted model (`script_file`, or the request's script).
    #[default]
    Scripted,
    /// Any OpenAI-compatible Chat Completions server (OpenAI, vLLM, Ollama, llama.cpp, LiteLLM).
    Openai,
    /// Anthropic Messages.
    Anthropic,
}

impl Provider {
    fn name(self) -> &'static str {
        match self {
            Provider::Scripted => "scripted",
            Provider::Openai => "openai",
            Provider::Anthropic => "anthropic",
        }
    }
}

/// The `model` section of a profile. Holds the *name* of the environment variable with
/// the API key, never the key, so configuration can be logged and stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// The adapter.
    pub provider: Provider,
    /// The provider's model name (e.g. `gpt-4o`, `claude-sonnet-4-5`, `qwen2.5`).
    pub model: String,
    /// Base URL; defaults to `OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL`, then the public API.
    /// OpenAI-style URLs include `/v1`; Anthropic-style ones do not.
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key; defaults to
    /// `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`. When named here it must be set.
    pub api_key_env: Option<String>,
    /// Output-token cap per call. Anthropic requires one (4096 when unset); OpenAI gets
    /// `max_tokens` only when set, since some compatible servers reject it.
    pub max_tokens: Option<u32>,
    /// Deadline of one HTTP attempt, in milliseconds.
    pub timeout_ms: u64,
    /// Deadline for connecting, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Retries after the first attempt on 429, 5xx, timeouts and broken connections.
    pub max_retries: u32,
    /// First backoff, in milliseconds; doubled per retry, with jitter.
    pub initial_backoff_ms: u64,
    /// Longest backoff, in milliseconds.
    pub max_backoff_ms: u64,
    /// Longest wait a `Retry-After` header may impose, in milliseconds.
    pub max_retry_after_ms: u64,
    /// Largest response body accepted, in bytes.
    pub max_response_bytes: usize,
    /// Committed turns of the request's history shown in full; older ones in the window
    /// become one-line notes.
    pub keep_last_turns: usize,
    /// Longest tool output (or note) put into the prompt, in bytes; the rest is elided.
    pub max_observation_bytes: usize,
    /// Replaces the built-in system prompt; the instruction to close an answer with its
    /// `Evidence:` line is still added, as the adapters depend on it.
    pub system_prompt: Option<String>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            provider: Provider::Scripted,
            model: String::new(),
            base_url: None,
            api_key_env: None,
            max_tokens: None,
            timeout_ms: 120_000,
            connect_timeout_ms: 10_000,
            max_retries: 3,
            initial_backoff_ms: 500,
            max_backoff_ms: 8_000,
            max_retry_after_ms: 30_000,
            max_response_bytes: 8 * 1024 * 1024,
            keep_last_turns: 6,
            max_observation_bytes: 16 * 1024,
            system_prompt: None,
        }
    }
}

/// Why a model adapter could not be built from its configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelConfigError {
    /// A `--model` spec that is not `provider:model`.
    #[error("model spec {0:?} is not `openai:MODEL` or `anthropic:MODEL`")]
    BadSpec(String),
    /// The provider needs a model name.
    #[error("{0} model needs a model name")]
    NoModelName(&'static str),
    /// The scripted provider has no adapter to build (it uses `script_file`).
    #[error("the scripted provider is configured through script_file, not a model section")]
    Scripted,
    /// `api_key_env` names a variable that is not set.
    #[error("api_key_env names {0}, which is not set")]
    MissingKey(String),
    /// The base URL is not http(s).
    #[error("base_url {0:?} must start with http:// or https://")]
    BadBaseUrl(String),
    /// A numeric setting is out of range.
    #[error("{0}")]
    OutOfRange(String),
    /// An adapter was built from a section for another provider.
    #[error("this configuration is not for the {0} provider")]
    WrongProvider(&'static str),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

impl ModelConfig {
    /// Parses the command line's `provider:model` form (`openai:gpt-4o`,
    /// `anthropic:claude-sonnet-4-5`), with every other setting at its default.
    ///
    /// # Errors
    ///
    /// [`ModelConfigError::BadSpec`] for anything else.
    pub fn from_spec(spec: &str) -> Result<ModelConfig, ModelConfigError> {
        let (provider, model) = spec
            .split_once(':')
            .ok_or_else(|| ModelConfigError::BadSpec(spec.to_owned()))?;
        let provider = match provider {
            "openai" => Provider::Openai,
            "anthropic" => Provider::Anthropic,
            _ => return Err(ModelConfigError::BadSpec(spec.to_owned())),
        };
        if model.trim().is_empty() {
            return Err(ModelConfigError::BadSpec(spec.to_owned()));
        }
        Ok(ModelConfig {
            provider,
            model: model.to_owned(),
            ..ModelConfig::default()
        })
    }

    /// Builds the adapter, reading the key and base URL from the process environment.
    ///
    /// # Errors
    ///
    /// [`ModelConfigError`] when the configuration is incomplete or inconsistent.
    pub fn build(&self) -> Result<Arc<dyn Model>, ModelConfigError> {
        self.build_with(&ProcessEnv, &AdapterDeps::default())
    }

    /// Builds the adapter with an injected environment, sleeper and jitter seed (tests).
    ///
    /// # Errors
    ///
    /// [`ModelConfigError`] when the configuration is incomplete or inconsistent.
    pub fn build_with(
        &self,
        env: &dyn EnvSource,
        deps: &AdapterDeps,
    ) -> Result<Arc<dyn Model>, ModelConfigError> {
        let settings = self.resolve(env, deps)?;
        Ok(match self.provider {
            Provider::Openai => Arc::new(OpenAiModel::new(settings)),
            Provider::Anthropic => Arc::new(AnthropicModel::new(settings)),
            Provider::Scripted => return Err(ModelConfigError::Scripted),
        })
    }

    pub(crate) fn resolve(
        &self,
        env: &dyn EnvSource,
        deps: &AdapterDeps,
    ) -> Result<Settings, ModelConfigError> {
        let (base_var, key_var, default_base) = match self.provider {
            Provider::Openai => (
                "OPENAI_BASE_URL",
                "OPENAI_API_KEY",
                "https://api.openai.com/v1",
            ),
            Provider::Anthropic => (
                "ANTHROPIC_BASE_URL",
                "ANTHROPIC_API_KEY",
                "https://api.anthropic.com",
            ),
            Provider::Scripted => return Err(ModelConfigError::Scripted),
        };
        if self.model.trim().is_empty() {
            return Err(ModelConfigError::NoModelName(self.provider.name()));
        }
        let base_url = self
            .base_url
            .clone()
            .or_else(|| env.var(base_var).filter(|v| !v.is_empty()))
            .unwrap_or_else(|| default_base.to_owned());
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(ModelConfigError::BadBaseUrl(base_url));
        }
        let api_key = match &self.api_key_env {
            Some(name) => Some(
                env.var(name)
                    .filter(|v| !v.is_empty())
                    .map(ApiKey)
                    .ok_or_else(|| ModelConfigError::MissingKey(name.clone()))?,
            ),
            None => env.var(key_var).filter(|v| !v.is_empty()).map(ApiKey),
        };
        if self.timeout_ms == 0 || self.connect_timeout_ms == 0 {
            return Err(ModelConfigError::OutOfRange(
                "timeout_ms and connect_timeout_ms must be more than 0".into(),
            ));
        }
        if self.max_retries > 10 {
            return Err(ModelConfigError::OutOfRange(
                "max_retries is at most 10".into(),
            ));
        }
        if self.max_response_bytes == 0 || self.max_observation_bytes == 0 {
            return Err(ModelConfigError::OutOfRange(
                "max_response_bytes and max_observation_bytes must be more than 0".into(),
            ));
        }
        let retry = RetryPolicy {
            max_retries: self.max_retries,
            initial_backoff: Duration::from_millis(self.initial_backoff_ms),
            max_backoff: Duration::from_millis(self.max_backoff_ms.max(self.initial_backoff_ms)),
            max_retry_after: Duration::from_millis(self.max_retry_after_ms),
        };
        let transport = Transport::new(
            Duration::from_millis(self.timeout_ms),
            Duration::from_millis(self.connect_timeout_ms),
            self.max_response_bytes,
            retry,
            deps.sleeper.clone(),
            deps.seed,
        )?;
        Ok(Settings {
            model: self.model.clone(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            max_tokens: self.max_tokens,
            context: ContextConfig {
                keep_last_turns: self.keep_last_turns,
                max_observation_bytes: self.max_observation_bytes,
                system_prompt: self.system_prompt.clone(),
            },
            transport,
        })
    }
}

/// Everything an adapter needs, resolved from [`ModelConfig`] and the environment.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) model: String,
    pub(crate) base_url: String,
    pub(crate) api_key: Option<ApiKey>,
    pub(crate) max_tokens: Option<u32>,
    pub(crate) context: ContextConfig,
    pub(crate) transport: Transport,
}

/// What tests swap out: how backoff waits, and the jitter seed.
#[derive(Debug, Clone)]
pub struct AdapterDeps {
    /// How the adapter waits between retries.
    pub sleeper: Arc<dyn Sleeper>,
    /// Seed of the jitter RNG; `None` seeds from the OS.
    pub seed: Option<u64>,
}

impl Default for AdapterDeps {
    fn default() -> Self {
        AdapterDeps {
            sleeper: Arc::new(TokioSleeper),
            seed: None,
        }
    }
}

/// An API key. Its `Debug` is redacted so it never reaches a log line.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ApiKey(pub(crate) String);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Where environment variables are read from; injectable so tests need not mutate the
/// process environment.
pub trait EnvSource: Send + Sync {
    /// The variable's value, if set and valid UTF-8.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

/// A fixed set of variables (tests).
#[derive(Debug, Clone, Default)]
pub struct MapEnv(pub BTreeMap<String, String>);

impl MapEnv {
    /// A source holding exactly `vars`.
    pub fn new<'a>(vars: impl IntoIterator<Item = (&'a str, &'a str)>) -> MapEnv {
        MapEnv(
            vars.into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }
}

impl EnvSource for MapEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        let c = ModelConfig::from_spec("openai:qwen2.5").unwrap();
        assert_eq!(
            (c.provider, c.model.as_str()),
            (Provider::Openai, "qwen2.5")
        );
        let c = ModelConfig::from_spec("anthropic:claude-x:1").unwrap();
        assert_eq!(
            (c.provider, c.model.as_str()),
            (Provider::Anthropic, "claude-x:1")
        );
        for bad in ["openai", "gemini:x", "openai:", "scripted:x"] {
            assert!(ModelConfig::from_spec(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn env_defaults_apply_and_keys_are_redacted() {
        crate::install_crypto();
        let env = MapEnv::new([
            ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/"),
            ("OPENAI_API_KEY", "sk-secret-123"),
        ]);
        let config = ModelConfig::from_spec("openai:m").unwrap();
        let settings = config.resolve(&env, &AdapterDeps::default()).unwrap();
        assert_eq!(settings.base_url, "http://127.0.0.1:9/v1");
        assert_eq!(settings.api_key, Some(ApiKey("sk-secret-123".into())));
        let shown = format!("{settings:?}");
        assert!(!shown.contains("sk-secret"), "{shown}");
        let model = config.build_with(&env, &AdapterDeps::default()).unwrap();
        assert!(!format!("{model:?}").contains("sk-secret"));
    }

    #[test]
    fn a_named_key_variable_must_be_set() {
        crate::install_crypto();
        let config = ModelConfig {
            api_key_env: Some("MY_KEY".into()),
            ..ModelConfig::from_spec("anthropic:m").unwrap()
        };
        let error = config
            .resolve(&MapEnv::default(), &AdapterDeps::default())
            .unwrap_err();
        assert_eq!(error, ModelConfigError::MissingKey("MY_KEY".into()));
        let env = MapEnv::new([("MY_KEY", "k"), ("ANTHROPIC_API_KEY", "other")]);
        let settings = config.resolve(&env, &AdapterDeps::default()).unwrap();
        assert_eq!(settings.api_key, Some(ApiKey("k".into())));
        assert_eq!(settings.base_url, "https://api.anthropic.com");
    }
}
