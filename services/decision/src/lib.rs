//! The decision service of agentloop: it turns one turn's bounded context into one
//! typed decision by asking a model, and serves that as `DecisionService.Decide`.
//!
//! Provider formats stay in here: out comes the closed `Decision` of the contracts, an
//! `InvalidOutput` when the model's output is not a decision, or a gRPC error status
//! when the provider failed (which the orchestrator maps to `model_error`).
//!
//! Adapters behind the [`Model`] seam: the offline [`ScriptedModel`] (the stable format
//! of `docs/models.md`), [`OpenAiModel`] (Chat Completions: OpenAI, vLLM, Ollama, llama.cpp,
//! LiteLLM) and [`AnthropicModel`] (Messages), configured per profile by a
//! [`ModelConfig`]. Provider call IDs that are missing, repeated or already used are
//! replaced by runtime IDs (`call-<turn>-<index>`); a text answer's closing `Evidence:`
//! line becomes the call IDs it cites; a refusal becomes `cannot_continue`;
//! malformed tool-call arguments become `InvalidOutput`; 429, 5xx, timeouts, resets and
//! truncated bodies are retried with bounded, jittered backoff (honouring
//! `Retry-After`), then fail as UNAVAILABLE with the provider's status in the message.
//! The prompt is built only from what the request carries (the goal, the summary, a
//! bounded window of committed events), so its cost does not grow with the invocation.
//! A model with an entry in the price table ([`DecisionConfig::prices`]) is wrapped in a
//! [`PricedModel`], so its replies carry their cost in micro-dollars next to the tokens;
//! other models report no cost, which the engine refuses under a cost budget.
//!
//! It is *not* the judge of decisions: it validates nothing about tool calls (unknown
//! tools, non-object arguments and duplicate call IDs pass through untouched for the
//! engine and policy to refuse), holds no invocation state and executes nothing.
//!
//! Status codes of `Decide`:
//!
//! | situation | status |
//! |---|---|
//! | missing `invocation_id`, `turn` 0, malformed `scripted_model_json` | INVALID_ARGUMENT |
//! | no script in the request and no `script_file` configured | FAILED_PRECONDITION |
//! | the script has no turn N and `repeat_last` is false | FAILED_PRECONDITION |
//! | a scripted `model_error`, a provider failure after retries | UNAVAILABLE |
//! | a scripted `raw` (output that is not a decision) | OK, `outcome.invalid` |

#![warn(missing_docs)]

mod adapter;
mod cache;
pub mod cassette;
mod model;
mod observe;
mod price;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use agentloop_proto::v1::decision_service_server::DecisionService;
use agentloop_proto::v1::{DecideRequest, DecideResponse, ToolDescriptor, decide_response};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

pub use adapter::MAX_CALLS_PER_RESPONSE;
pub use adapter::anthropic::{ANTHROPIC_VERSION, AnthropicModel, DEFAULT_ANTHROPIC_MAX_TOKENS};
pub use adapter::config::{
    AdapterDeps, EnvSource, MapEnv, ModelConfig, ModelConfigError, ProcessEnv, Provider,
};
pub use adapter::context::MAX_HISTORY_EVENTS;
pub use adapter::http::{RetryPolicy, Sleeper, TokioSleeper};
pub use adapter::openai::OpenAiModel;
pub use agentloop_script::{
    MAX_DELAY_MS, MAX_SCRIPT_BYTES, MAX_TURNS, ScriptError, ScriptedCall, ScriptedDecision,
    ScriptedModel, ScriptedTurn, ScriptedUsage,
};
pub use cache::{MAX_CACHED_BYTES, MAX_ENTRIES, ScriptCache};
pub use model::{Model, ModelError, ModelReply, Proposal, Question, Reads, SCRIPTED_MODEL_NAME};
pub use price::{Price, PricedModel};

/// Longest `invocation_id` accepted, in bytes; IDs end up in logs and response IDs.
pub const MAX_INVOCATION_ID_BYTES: usize = 256;

/// Configuration of the decision service (layered by `agentloop_server::config`;
/// environment prefix `AGENTLOOP_DECISION_`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DecisionConfig {
    /// The settings every service has: `listen`, `metrics_listen`, `[auth]`,
    /// `insecure_no_auth`, `[telemetry]`, `[server_tls]`.
    #[serde(flatten)]
    pub server: agentloop_server::ServerSettings,
    /// A scripted-model file used when a request carries no `scripted_model_json`.
    /// Without it, such requests fail with FAILED_PRECONDITION.
    pub script_file: Option<PathBuf>,
    /// The model of profiles without their own `profiles.<name>.model`; unset (or
    /// `provider = "scripted"`) means `script_file` decides.
    pub model: Option<ModelConfig>,
    /// Per-profile settings, by the profile name the orchestrator sends.
    pub profiles: BTreeMap<String, ProfileConfig>,
    /// The price table, by model name exactly as a `model` section names it. A model
    /// without an entry reports no cost, and an invocation with a cost budget then ends
    /// with `model_error` instead of running unmetered.
    pub prices: BTreeMap<String, Price>,
    /// Records every decision of the configured models (not of scripts) into this
    /// folder, one cassette per invocation (`ID.cassette.json`), replayable with
    /// `agentloop run --cassette`. Off by default: a cassette holds what the model was
    /// told and answered.
    pub record_dir: Option<PathBuf>,
    /// Keys no setting took: refused as the configuration loads.
    #[serde(flatten)]
    pub unknown: agentloop_server::UnknownKeys,
}

impl Default for DecisionConfig {
    fn default() -> Self {
        DecisionConfig {
            server: agentloop_server::ServerSettings::on_port(50052),
            script_file: None,
            model: None,
            profiles: BTreeMap::new(),
            prices: BTreeMap::new(),
            record_dir: None,
            unknown: agentloop_server::UnknownKeys,
        }
    }
}

/// The shared start (`agentloop_server::Service::start`) binds `listen`.
impl agentloop_server::ServiceConfig for DecisionConfig {
    type Auth = agentloop_auth::CallersConfig;

    fn server(&self) -> &agentloop_server::ServerSettings {
        &self.server
    }
}

/// One profile's decision settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProfileConfig {
    /// The profile's model.
    pub model: ModelConfig,
}

/// Installs the process-wide TLS provider once; reqwest needs it even for `http://`.
pub(crate) fn install_crypto() {
    agentloop_server::install_crypto_provider();
}

/// Why the service could not be set up from its configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// `script_file` could not be read.
    #[error("cannot read script_file {}: {source}", path.display())]
    ReadScript {
        /// The configured path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `script_file` is not a valid script.
    #[error("invalid script_file {}: {source}", path.display())]
    InvalidScript {
        /// The configured path.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: ScriptError,
    },
    /// A `model` section cannot be turned into an adapter.
    #[error("invalid model configuration{}: {source}", profile.as_deref().map(|p| format!(" of profile {p}")).unwrap_or_default())]
    Model {
        /// The profile; `None` for the default `model`.
        profile: Option<String>,
        /// What is wrong.
        #[source]
        source: ModelConfigError,
    },
}

/// The `DecisionService` implementation: per-request scripts (parsed once, cached) or
/// the configured default model.
#[derive(Debug, Clone)]
pub struct DecisionServer {
    default_model: Option<Arc<dyn Model>>,
    profiles: Arc<BTreeMap<String, Arc<dyn Model>>>,
    scripts: Arc<ScriptCache>,
    recorded: observe::Recorded,
}

impl DecisionServer {
    /// A server whose requests without `scripted_model_json` go to `default_model`
    /// (`None`: such requests fail with FAILED_PRECONDITION).
    pub fn new(default_model: Option<Arc<dyn Model>>) -> DecisionServer {
        DecisionServer {
            default_model,
            profiles: Arc::new(BTreeMap::new()),
            scripts: Arc::new(ScriptCache::new()),
            recorded: observe::Recorded::new(agentloop_telemetry::Telemetry::off()),
        }
    }

    /// The same server, recording its model calls (`chat {model}` spans, the model
    /// metrics) through `telemetry`.
    #[must_use]
    pub fn with_telemetry(mut self, telemetry: &agentloop_telemetry::Telemetry) -> DecisionServer {
        self.recorded = observe::Recorded::new(telemetry.clone());
        self
    }

    /// The same server, with requests for `profile` (without a script) going to `model`.
    #[must_use]
    pub fn with_profile_model(mut self, profile: &str, model: Arc<dyn Model>) -> DecisionServer {
        Arc::make_mut(&mut self.profiles).insert(profile.to_owned(), model);
        self
    }

    /// A server configured from `config`: reads and parses `script_file`, if set.
    ///
    /// # Errors
    ///
    /// [`SetupError`] when the script file cannot be read or does not parse.
    pub fn from_config(config: &DecisionConfig) -> Result<DecisionServer, SetupError> {
        DecisionServer::from_config_with(config, &ProcessEnv, &AdapterDeps::default())
    }

    /// [`DecisionServer::from_config`] with an injected environment and adapter
    /// dependencies (tests).
    ///
    /// # Errors
    ///
    /// [`SetupError`] when the script file or a model section is unusable.
    pub fn from_config_with(
        config: &DecisionConfig,
        env: &dyn EnvSource,
        deps: &AdapterDeps,
    ) -> Result<DecisionServer, SetupError> {
        let build = |profile: Option<&str>, model: &ModelConfig| {
            let built = model
                .build_with(env, deps)
                .map_err(|source| SetupError::Model {
                    profile: profile.map(str::to_owned),
                    source,
                })?;
            let priced: Arc<dyn Model> = match config.prices.get(&model.model) {
                Some(price) => Arc::new(PricedModel::new(built, *price)),
                None => built,
            };
            Ok::<_, SetupError>(match &config.record_dir {
                Some(folder) => Arc::new(cassette::Recording::into_folder(priced, folder.clone())),
                None => priced,
            })
        };
        let mut server = match &config.model {
            Some(model) if model.provider != Provider::Scripted => {
                DecisionServer::new(Some(build(None, model)?))
            }
            Some(_) | None => DecisionServer::scripted_from(config)?,
        };
        for (name, profile) in &config.profiles {
            if profile.model.provider != Provider::Scripted {
                let model = build(Some(name), &profile.model)?;
                server = server.with_profile_model(name, model);
            }
        }
        Ok(server)
    }

    fn scripted_from(config: &DecisionConfig) -> Result<DecisionServer, SetupError> {
        let Some(path) = &config.script_file else {
            return Ok(DecisionServer::new(None));
        };
        let text = std::fs::read_to_string(path).map_err(|source| SetupError::ReadScript {
            path: path.clone(),
            source,
        })?;
        let model = ScriptedModel::parse(&text).map_err(|source| SetupError::InvalidScript {
            path: path.clone(),
            source,
        })?;
        Ok(DecisionServer::new(Some(Arc::new(model))))
    }

    /// Decides one turn: the core of `Decide`, without the gRPC wrapping.
    ///
    /// # Errors
    ///
    /// A [`ModelError`]; see the crate documentation for the status each maps to.
    pub async fn decide(&self, request: &DecideRequest) -> Result<ModelReply, ModelError> {
        self.decide_with(request, &request.tools).await
    }

    /// [`DecisionServer::decide`] with the tools apart from the request (whose own
    /// `tools` are not read), for a caller in the same process that shares one list of
    /// tools among many invocations; see [`Model::decide_with`].
    ///
    /// # Errors
    ///
    /// As [`DecisionServer::decide`].
    pub async fn decide_with(
        &self,
        request: &DecideRequest,
        tools: &[ToolDescriptor],
    ) -> Result<ModelReply, ModelError> {
        let question = Question::from(request);
        if request.scripted_model_json.is_empty() {
            return self.decide_for(&request.profile, &question, tools).await;
        }
        check(&question)?;
        let script = self.scripts.get_or_parse(&request.scripted_model_json)?;
        self.recorded.chat(&*script, &question, tools).await
    }

    /// Decides one turn with the model of `profile`, for a caller in the same process
    /// that asks with its own values: nothing of it is a wire message but the events of
    /// the window and the tools, which the model reads.
    ///
    /// # Errors
    ///
    /// As [`DecisionServer::decide`].
    pub async fn decide_for(
        &self,
        profile: &str,
        question: &Question<'_>,
        tools: &[ToolDescriptor],
    ) -> Result<ModelReply, ModelError> {
        check(question)?;
        match self.model_of(profile) {
            Some(model) => self.recorded.chat(&**model, question, tools).await,
            None => Err(ModelError::NoModel),
        }
    }

    /// The model of `profile`'s requests that carry no script, if there is one.
    fn model_of(&self, profile: &str) -> Option<&Arc<dyn Model>> {
        self.profiles.get(profile).or(self.default_model.as_ref())
    }

    /// What the model of `profile` reads of a request ([`Model::reads`]); nothing when
    /// it has no model.
    pub fn reads(&self, profile: &str) -> Reads {
        self.model_of(profile)
            .map_or(Reads::NOTHING, |model| model.reads())
    }

    /// What the model that answers `request` reads: a script reads nothing.
    fn reads_of(&self, request: &DecideRequest) -> Reads {
        match request.scripted_model_json.is_empty() {
            true => self.reads(&request.profile),
            false => Reads::NOTHING,
        }
    }
}

/// Whether `request` left out events or tools that `reads` needs. Events are left out
/// oldest first, so what remains is enough when it holds as many as the model reads.
fn left_out_too_much(request: &DecideRequest, reads: Reads) -> bool {
    (request.history_left_out > 0 && request.history.len() < reads.history)
        || (request.tools_left_out && reads.tools)
}

impl DecisionServer {
    /// Decides turn `turn` of an offline run of `invocation_id` from its script, which a
    /// caller in the same process parsed once: nothing else of the turn is read.
    ///
    /// # Errors
    ///
    /// As [`DecisionServer::decide`].
    pub async fn decide_scripted(
        &self,
        model: &ScriptedModel,
        invocation_id: &str,
        turn: u32,
    ) -> Result<ModelReply, ModelError> {
        let question = Question {
            invocation_id,
            turn,
            ..Question::default()
        };
        check(&question)?;
        self.recorded.chat(model, &question, &[]).await
    }
}

/// What every question must hold, whichever model answers it.
fn check(question: &Question<'_>) -> Result<(), ModelError> {
    if question.invocation_id.is_empty() {
        return Err(ModelError::InvalidRequest(
            "invocation_id is required".into(),
        ));
    }
    if question.invocation_id.len() > MAX_INVOCATION_ID_BYTES {
        return Err(ModelError::InvalidRequest(format!(
            "invocation_id is {} bytes; at most {MAX_INVOCATION_ID_BYTES} are allowed",
            question.invocation_id.len()
        )));
    }
    if question.turn == 0 {
        return Err(ModelError::InvalidRequest(
            "turn is 1-based and must be 1 or more".into(),
        ));
    }
    Ok(())
}

#[tonic::async_trait]
impl DecisionService for DecisionServer {
    async fn decide(
        &self,
        request: tonic::Request<DecideRequest>,
    ) -> Result<tonic::Response<DecideResponse>, tonic::Status> {
        let request = request.into_inner();
        let reads = self.reads_of(&request);
        if left_out_too_much(&request, reads) {
            return Ok(tonic::Response::new(DecideResponse {
                outcome: Some(decide_response::Outcome::Resend(reads.into())),
                reads: Some(reads.into()),
                ..DecideResponse::default()
            }));
        }
        match DecisionServer::decide(self, &request).await {
            Ok(reply) => {
                let mut response = DecideResponse::from(reply);
                response.reads = Some(reads.into());
                Ok(tonic::Response::new(response))
            }
            Err(error) => {
                tracing::debug!(invocation_id = %request.invocation_id, turn = request.turn, %error, "decide failed");
                Err(error.into())
            }
        }
    }
}

/// Serves `server` on `listener` with the shared server setup (health, reflection,
/// tracing) until `shutdown` resolves, then drains in-flight requests.
///
/// # Errors
///
/// [`agentloop_server::ServeError`] when the server fails.
pub async fn run(
    listener: TcpListener,
    server: DecisionServer,
    access: agentloop_server::Access,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), agentloop_server::ServeError> {
    let services = agentloop_server::ServiceSet::new()
        .add_for(agentloop_proto::server::decision(server), &access);
    agentloop_server::serve(listener, services, shutdown).await
}
