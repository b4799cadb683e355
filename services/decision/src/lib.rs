//! The decision service of agentloop: it turns one turn's bounded context into one
//! typed decision by asking a model, and serves that as `DecisionService.Decide`.
//!
//! Provider formats stay in here: out comes the closed `Decision` of the contracts, an
//! `InvalidOutput` when the model's output is not a decision, or a gRPC error status
//! when the provider failed (which the orchestrator maps to `model_error`).
//!
//! Today the only adapter is the offline [`ScriptedModel`] (the stable format of
//! DESIGN.md); [`Model`] is the seam where provider adapters plug in.
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
//! | a scripted `model_error` (a provider failure) | UNAVAILABLE |
//! | a scripted `raw` (output that is not a decision) | OK, `outcome.invalid` |

#![warn(missing_docs)]

mod cache;
mod model;
mod script;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use agentloop_proto::v1::decision_service_server::DecisionService;
use agentloop_proto::v1::{DecideRequest, DecideResponse};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

pub use cache::{MAX_CACHED_BYTES, MAX_ENTRIES, ScriptCache};
pub use model::{Model, ModelError, ModelReply, SCRIPTED_MODEL_NAME};
pub use script::{
    MAX_DELAY_MS, MAX_SCRIPT_BYTES, MAX_TURNS, ScriptError, ScriptedCall, ScriptedDecision,
    ScriptedModel, ScriptedTurn, ScriptedUsage,
};

/// Longest `invocation_id` accepted, in bytes; IDs end up in logs and response IDs.
pub const MAX_INVOCATION_ID_BYTES: usize = 256;

/// Configuration of the decision service (layered by `agentloop_server::config`;
/// environment prefix `AGENTLOOP_DECISION_`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DecisionConfig {
    /// Address to listen on.
    pub listen: String,
    /// A scripted-model file used when a request carries no `scripted_model_json`.
    /// Without it, such requests fail with FAILED_PRECONDITION.
    pub script_file: Option<PathBuf>,
}

impl Default for DecisionConfig {
    fn default() -> Self {
        DecisionConfig {
            listen: "127.0.0.1:50052".into(),
            script_file: None,
        }
    }
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
}

/// The `DecisionService` implementation: per-request scripts (parsed once, cached) or
/// the configured default model.
#[derive(Debug, Clone)]
pub struct DecisionServer {
    default_model: Option<Arc<dyn Model>>,
    scripts: Arc<ScriptCache>,
}

impl DecisionServer {
    /// A server whose requests without `scripted_model_json` go to `default_model`
    /// (`None`: such requests fail with FAILED_PRECONDITION).
    pub fn new(default_model: Option<Arc<dyn Model>>) -> DecisionServer {
        DecisionServer {
            default_model,
            scripts: Arc::new(ScriptCache::new()),
        }
    }

    /// A server configured from `config`: reads and parses `script_file`, if set.
    ///
    /// # Errors
    ///
    /// [`SetupError`] when the script file cannot be read or does not parse.
    pub fn from_config(config: &DecisionConfig) -> Result<DecisionServer, SetupError> {
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
        if request.invocation_id.is_empty() {
            return Err(ModelError::InvalidRequest(
                "invocation_id is required".into(),
            ));
        }
        if request.invocation_id.len() > MAX_INVOCATION_ID_BYTES {
            return Err(ModelError::InvalidRequest(format!(
                "invocation_id is {} bytes; at most {MAX_INVOCATION_ID_BYTES} are allowed",
                request.invocation_id.len()
            )));
        }
        if request.turn == 0 {
            return Err(ModelError::InvalidRequest(
                "turn is 1-based and must be 1 or more".into(),
            ));
        }
        if !request.scripted_model_json.is_empty() {
            let script = self.scripts.get_or_parse(&request.scripted_model_json)?;
            return script.decide(request).await;
        }
        match &self.default_model {
            Some(model) => model.decide(request).await,
            None => Err(ModelError::NoModel),
        }
    }
}

#[tonic::async_trait]
impl DecisionService for DecisionServer {
    async fn decide(
        &self,
        request: tonic::Request<DecideRequest>,
    ) -> Result<tonic::Response<DecideResponse>, tonic::Status> {
        let request = request.into_inner();
        match DecisionServer::decide(self, &request).await {
            Ok(reply) => Ok(tonic::Response::new(reply.into())),
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
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), agentloop_server::ServeError> {
    let services =
        agentloop_server::ServiceSet::new().add(agentloop_proto::server::decision(server));
    agentloop_server::serve(listener, services, shutdown).await
}
