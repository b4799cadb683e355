//! One MCP server as a tool owner writes it in the registry: an entry of `[[mcp_servers]]`.
//!
//! ```toml
//! [[mcp_servers]]
//! name = "time"                    # its tools are offered as time__<tool>
//! command = "mcp-server-time"      # stdio; or url = "http://host:3001/mcp"
//! args = []
//! env = { TZ = "UTC" }             # stdio only
//! idempotent = ["some_tool"]       # tools that may be sent again with the same effect key
//! timeout_ms = 30000               # per call, 1..=600000
//! elicitation = "ask"              # a server's questions: ask a person, "defaults" or "decline"
//!
//! [[mcp_servers]]
//! name = "crm"
//! url = "https://crm.example/mcp"
//! [mcp_servers.oauth]              # the client credentials grant, when the server asks
//! client_id = "agentloop"
//! client_secret_file = "/run/secrets/crm"  # or client_secret_env, private_key_file, private_key_env
//! ```
//!
//! The format is stable: fields are only ever added. Unknown keys are refused, so a typo
//! is an error at load time instead of a silently ignored setting.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use crate::elicit::Elicitation;
use crate::oauth::{Algorithm, Credential, Grant, OAuth, OAuthSettings, Secret, Source};

/// Longest server name, in bytes. With the `__` separator it leaves 30 bytes of the
/// 64 a model API accepts in a function name for the tool's own name.
pub const MAX_SERVER_NAME_BYTES: usize = 32;
/// Longest per-call timeout, in milliseconds (ten minutes, as for the gateway's tools).
pub const MAX_TIMEOUT_MS: u64 = 600_000;
/// The per-call timeout of a server that sets none, in milliseconds.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// Longest command, argument, environment value, URL or header value, in bytes.
pub const MAX_VALUE_BYTES: usize = 4096;
/// Most arguments, environment variables, headers or idempotent tools of one server.
pub const MAX_ENTRIES: usize = 256;

/// Why an `[[mcp_servers]]` entry cannot be used. Every variant names the server, so an
/// operator can fix the registry without reading code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpConfigError {
    /// The name is empty, too long, has characters outside `[a-zA-Z0-9_-]`, contains
    /// `__` or ends with `_` (either would make `<server>__<tool>` ambiguous).
    #[error(
        "invalid MCP server name {0:?}: expected 1 to {MAX_SERVER_NAME_BYTES} characters of \
         [a-zA-Z0-9_-], without \"__\" and not ending with \"_\""
    )]
    InvalidName(String),
    /// Neither `command` nor `url` is set.
    #[error("MCP server {0:?}: set `command` (stdio) or `url` (streamable HTTP)")]
    NoTransport(String),
    /// Both `command` and `url` are set.
    #[error("MCP server {0:?}: set only one of `command` (stdio) and `url` (streamable HTTP)")]
    TwoTransports(String),
    /// A field is invalid, or set for the other transport.
    #[error("MCP server {server:?}: `{field}` {reason}")]
    InvalidField {
        /// The server's name.
        server: String,
        /// The field, as written in the registry.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An environment variable the entry names (`bearer_token_env`, `inherit_env`) is not
    /// set in the gateway's environment at start. Its value is never part of any message.
    #[error("MCP server {server:?}: environment variable {var:?} is not set (or not UTF-8)")]
    MissingEnv {
        /// The server's name.
        server: String,
        /// The variable's name.
        var: String,
    },
    /// A credential file the entry names cannot be read at start. Its content is never
    /// part of any message.
    #[error("MCP server {server:?}: cannot read `{field}` {path:?}: {reason}")]
    UnreadableFile {
        /// The server's name.
        server: String,
        /// The field naming the file.
        field: &'static str,
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("MCP server {server:?}: cannot build the HTTP client: {reason}")]
    HttpClient {
        /// The server's name.
        server: String,
        /// Why.
        reason: String,
    },
}

/// One MCP server, as written in the registry's `[[mcp_servers]]` array: exactly one of
/// `command` (a stdio server the gateway spawns) and `url` (a streamable HTTP server).
///
/// `Debug` leaves out the values of `env` and `headers`, which may hold secrets.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Names the server: its tools are offered as `<name>__<tool>`.
    pub name: String,
    /// Stdio: the program to run (looked up in `PATH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Stdio: the program's arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Stdio: environment variables set for the program. It gets only `PATH`, `HOME`,
    /// the locale and these from the gateway's own environment (see
    /// [`INHERITED_ENV`]), so the gateway's secrets do not reach third-party servers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Stdio: further variables passed on from the gateway's environment, by name (read
    /// at start), so a server's secret need not be written into the registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inherit_env: Vec<String>,
    /// Streamable HTTP: the server's endpoint, `http://host:port/mcp` or `https://...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Streamable HTTP: headers sent with every request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Streamable HTTP: the environment variable holding a bearer token, read at start
    /// and sent as `Authorization: Bearer <token>`; never logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_env: Option<String>,
    /// Streamable HTTP: how the gateway gets its own access token when the server asks
    /// for one (OAuth client credentials); not with `bearer_token_env`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<McpOAuthConfig>,
    /// The server's tools (by their own names, without the prefix) that may be sent
    /// again with the same effect key: offered as idempotent writes, and a call whose
    /// outcome was lost is sent again instead of waiting for an operator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub idempotent: Vec<String>,
    /// What the gateway does with the server's questions for a person
    /// (`elicitation/create`): ask one, the default.
    #[serde(default, skip_serializing_if = "Elicitation::is_ask")]
    pub elicitation: Elicitation,
    /// Longest one call may take, in milliseconds (1..=600000).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

/// The variables of the gateway's environment every stdio server gets: what programs
/// need to start (`PATH`, `HOME`, user and locale) and nothing that could be a secret.
pub const INHERITED_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
];

/// Headers the MCP transport sets itself; `Authorization` comes from `bearer_token_env`.
const RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "accept",
    "content-type",
    "content-length",
    "host",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}

/// The `[mcp_servers.oauth]` table of a streamable HTTP server that wants an OAuth access
/// token, from the authorization server the MCP server names. Two grants:
///
/// - **client credentials** (MCP's SEP-1046), without `token_file`: the gateway
///   authenticates as `client_id` with exactly one of `client_secret_env`,
///   `client_secret_file`, `private_key_env` and `private_key_file`;
/// - **authorization code**, with `token_file`: an operator authorizes once with
///   `agentloop mcp login` (registering a client unless `client_id` is set), and the
///   gateway refreshes the tokens that login left in the file.
///
/// The entry names where a credential is, never holds it. Variables are read at start;
/// files at every token request, so a rotated secret is picked up.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpOAuthConfig {
    /// The client's ID at the authorization server: required for client credentials;
    /// with `token_file`, a pre-registered client (else login registers one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// The authorization code grant: where `agentloop mcp login` writes the client and its
    /// tokens, and the gateway reads and refreshes them (mode 0600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// With `token_file` and no `client_id`: the `https` URL where the operator publishes
    /// the gateway's client metadata document, used as its client ID by an authorization
    /// server that takes such IDs (instead of registering a client).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_metadata_url: Option<String>,
    /// The environment variable holding the client secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret_env: Option<String>,
    /// The file holding the client secret (a trailing line break is ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret_file: Option<PathBuf>,
    /// The environment variable holding the private key, in PEM (`private_key_jwt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key_env: Option<String>,
    /// The file holding the private key, in PEM (`private_key_jwt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key_file: Option<PathBuf>,
    /// The private key's algorithm: ES256 (the default), ES384, RS256, RS384, RS512,
    /// PS256, PS384, PS512 or EdDSA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_algorithm: Option<String>,
    /// The scopes to ask for. Without them, the ones the server's challenge names, else
    /// the ones its resource metadata lists, else none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// The only authorization server (its `issuer`) the credentials may be sent to.
    /// Without it, whichever one the MCP server's metadata names: set it wherever the
    /// MCP server is not trusted with the client's secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization_server: Option<String>,
}

impl fmt::Debug for McpOAuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only names of variables and files: the entry never holds a credential.
        f.debug_struct("McpOAuthConfig")
            .field("client_id", &self.client_id)
            .field("token_file", &self.token_file)
            .field("client_metadata_url", &self.client_metadata_url)
            .field("client_secret_env", &self.client_secret_env)
            .field("client_secret_file", &self.client_secret_file)
            .field("private_key_env", &self.private_key_env)
            .field("private_key_file", &self.private_key_file)
            .field("signing_algorithm", &self.signing_algorithm)
            .field("scopes", &self.scopes)
            .field("authorization_server", &self.authorization_server)
            .finish()
    }
}

impl McpOAuthConfig {
    fn validate(
        &self,
        invalid: &impl Fn(&'static str, String) -> McpConfigError,
    ) -> Result<(), McpConfigError> {
        if let Some(client_id) = &self.client_id {
            check_value(client_id).map_err(|reason| invalid("oauth.client_id", reason))?;
            if client_id.is_empty() {
                return Err(invalid("oauth.client_id", "is empty".to_owned()));
            }
        }
        let secrets = usize::from(self.client_secret_env.is_some())
            + usize::from(self.client_secret_file.is_some());
        let keys = usize::from(self.private_key_env.is_some())
            + usize::from(self.private_key_file.is_some());
        for (field, path) in [
            ("oauth.token_file", &self.token_file),
            ("oauth.client_secret_file", &self.client_secret_file),
            ("oauth.private_key_file", &self.private_key_file),
        ] {
            if let Some(path) = path {
                let text = path
                    .to_str()
                    .ok_or_else(|| invalid(field, "is not UTF-8".to_owned()))?;
                check_value(text).map_err(|reason| invalid(field, reason))?;
                if text.is_empty() {
                    return Err(invalid(field, "is empty".to_owned()));
                }
            }
        }
        if self.token_file.is_some() {
            if keys > 0 {
                return Err(invalid(
                    "oauth",
                    "private_key_env and private_key_file are for the client credentials grant, \
                     not with token_file"
                        .to_owned(),
                ));
            }
            if secrets > 1 {
                return Err(invalid(
                    "oauth",
                    "takes at most one of client_secret_env and client_secret_file".to_owned(),
                ));
            }
            if let Some(document) = &self.client_metadata_url {
                check_value(document)
                    .map_err(|reason| invalid("oauth.client_metadata_url", reason))?;
                let parsed = reqwest::Url::parse(document).ok();
                let https_with_path = parsed.as_ref().is_some_and(|u| {
                    u.scheme() == "https" && u.path() != "/" && u.host().is_some()
                });
                if !https_with_path || self.client_id.is_some() {
                    return Err(invalid(
                        "oauth.client_metadata_url",
                        "must be an https URL with a path, and is instead of client_id".to_owned(),
                    ));
                }
            }
            if secrets == 1 && self.client_id.is_none() {
                return Err(invalid(
                    "oauth.client_id",
                    "is needed with a client secret (a pre-registered client)".to_owned(),
                ));
            }
        } else {
            if self.client_id.is_none() {
                return Err(invalid(
                    "oauth.client_id",
                    "is needed for the client credentials grant (or set token_file for a \
                     login)"
                        .to_owned(),
                ));
            }
            if self.client_metadata_url.is_some() {
                return Err(invalid(
                    "oauth.client_metadata_url",
                    "is for a login (with token_file)".to_owned(),
                ));
            }
            if secrets + keys != 1 {
                return Err(invalid(
                    "oauth",
                    "needs exactly one of client_secret_env, client_secret_file, \
                     private_key_env and private_key_file"
                        .to_owned(),
                ));
            }
        }
        for (field, var) in [
            ("oauth.client_secret_env", &self.client_secret_env),
            ("oauth.private_key_env", &self.private_key_env),
        ] {
            if let Some(var) = var
                && !valid_env_name(var)
            {
                return Err(invalid(field, format!("is not a variable name: {var:?}")));
            }
        }
        if let Some(name) = &self.signing_algorithm {
            if self.private_key_env.is_none() && self.private_key_file.is_none() {
                return Err(invalid(
                    "oauth.signing_algorithm",
                    "is for private_key_env and private_key_file only".to_owned(),
                ));
            }
            if Algorithm::parse(name).is_none() {
                return Err(invalid(
                    "oauth.signing_algorithm",
                    format!("is {name:?}, not one of {:?}", Algorithm::names()),
                ));
            }
        }
        if self.scopes.len() > MAX_ENTRIES {
            return Err(invalid(
                "oauth.scopes",
                format!("has more than {MAX_ENTRIES} entries"),
            ));
        }
        for scope in &self.scopes {
            // RFC 6749, section 3.3: printable ASCII without space, `"` or `\`.
            let valid = !scope.is_empty()
                && scope.len() <= 256
                && scope
                    .bytes()
                    .all(|b| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'\\');
            if !valid {
                return Err(invalid(
                    "oauth.scopes",
                    format!("has an invalid scope {scope:?}"),
                ));
            }
        }
        if let Some(issuer) = &self.authorization_server {
            http_url(issuer).map_err(|reason| invalid("oauth.authorization_server", reason))?;
        }
        Ok(())
    }

    /// The settings with the variables read; a credential file must be readable now,
    /// though it is read again at every token request. A token file is read when the
    /// server first asks for a token: until a login writes it, the server is down.
    fn settings(
        &self,
        server: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<OAuthSettings, McpConfigError> {
        let grant = match (&self.token_file, &self.client_id) {
            (Some(token_file), _) => Grant::Login {
                token_file: token_file.clone(),
            },
            (None, Some(client_id)) => {
                let secret = self.client_secret(server, lookup)?;
                let key = self.source(
                    server,
                    lookup,
                    &self.private_key_env,
                    &self.private_key_file,
                    "oauth.private_key_file",
                )?;
                let credential = match (secret, key) {
                    (Some(secret), _) => Credential::Secret(secret),
                    (None, Some(key)) => Credential::PrivateKey {
                        key,
                        algorithm: self
                            .signing_algorithm
                            .as_deref()
                            .and_then(Algorithm::parse)
                            .unwrap_or(Algorithm::DEFAULT),
                    },
                    (None, None) => return Err(no_credential(server)),
                };
                Grant::ClientCredentials {
                    client_id: client_id.clone(),
                    credential,
                }
            }
            // Validated: client credentials always name a client.
            (None, None) => return Err(no_credential(server)),
        };
        Ok(OAuthSettings {
            grant,
            scopes: self.scopes.clone(),
            authorization_server: self.authorization_server.clone(),
        })
    }

    /// Where the client secret is, if the entry names one.
    pub(crate) fn client_secret(
        &self,
        server: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Source>, McpConfigError> {
        self.source(
            server,
            lookup,
            &self.client_secret_env,
            &self.client_secret_file,
            "oauth.client_secret_file",
        )
    }

    /// Where a credential is: a variable's value (read now), or a file that must be
    /// readable now.
    fn source(
        &self,
        server: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
        var: &Option<String>,
        file: &Option<PathBuf>,
        field: &'static str,
    ) -> Result<Option<Source>, McpConfigError> {
        if let Some(var) = var {
            let value = lookup(var).ok_or_else(|| McpConfigError::MissingEnv {
                server: server.to_owned(),
                var: var.clone(),
            })?;
            return Ok(Some(Source::Value(Secret::new(value))));
        }
        if let Some(path) = file {
            std::fs::File::open(path).map_err(|e| McpConfigError::UnreadableFile {
                server: server.to_owned(),
                field,
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            return Ok(Some(Source::File(path.clone())));
        }
        Ok(None)
    }
}

fn no_credential(server: &str) -> McpConfigError {
    McpConfigError::InvalidField {
        server: server.to_owned(),
        field: "oauth",
        reason: "names no credential".to_owned(),
    }
}

impl fmt::Debug for McpServerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpServerConfig")
            .field("name", &self.name)
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("inherit_env", &self.inherit_env)
            .field("url", &self.url)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("bearer_token_env", &self.bearer_token_env)
            .field("oauth", &self.oauth)
            .field("idempotent", &self.idempotent)
            .field("timeout_ms", &self.timeout_ms)
            .field("elicitation", &self.elicitation)
            .finish()
    }
}

/// How the executor reaches its server, once the entry is validated.
pub(crate) enum Endpoint {
    /// A child process speaking JSON-RPC lines on stdin and stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        /// The whole environment of the child: inherited, then `inherit_env`, then `env`.
        env: BTreeMap<String, String>,
    },
    /// A streamable HTTP endpoint.
    Http {
        /// The client every session of this server uses.
        client: reqwest::Client,
        url: String,
        headers: Vec<(HeaderName, HeaderValue)>,
        /// Read from `bearer_token_env` at start.
        bearer_token: Option<String>,
        /// The OAuth client, for a server with `[mcp_servers.oauth]`.
        oauth: Option<Arc<OAuth>>,
    },
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Stdio { command, args, .. } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .finish_non_exhaustive(),
            Endpoint::Http { url, .. } => f
                .debug_struct("Http")
                .field("url", url)
                .finish_non_exhaustive(),
        }
    }
}

impl McpServerConfig {
    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Checks the entry without touching the environment or the network.
    ///
    /// # Errors
    ///
    /// The first problem found, naming the server.
    pub fn validate(&self) -> Result<(), McpConfigError> {
        if !valid_server_name(&self.name) {
            return Err(McpConfigError::InvalidName(self.name.clone()));
        }
        let invalid = |field: &'static str, reason: String| McpConfigError::InvalidField {
            server: self.name.clone(),
            field,
            reason,
        };
        if self.timeout_ms == 0 || self.timeout_ms > MAX_TIMEOUT_MS {
            return Err(invalid(
                "timeout_ms",
                format!("must be 1 to {MAX_TIMEOUT_MS}"),
            ));
        }
        if self.idempotent.len() > MAX_ENTRIES {
            return Err(invalid(
                "idempotent",
                format!("lists more than {MAX_ENTRIES} tools"),
            ));
        }
        for (index, tool) in self.idempotent.iter().enumerate() {
            if !crate::names::valid_tool_part(tool) {
                return Err(invalid(
                    "idempotent",
                    format!("names {tool:?}, which is not a tool name of [a-zA-Z0-9_-]"),
                ));
            }
            if self.idempotent[..index].contains(tool) {
                return Err(invalid("idempotent", format!("lists {tool:?} twice")));
            }
        }
        match (&self.command, &self.url) {
            (None, None) => Err(McpConfigError::NoTransport(self.name.clone())),
            (Some(_), Some(_)) => Err(McpConfigError::TwoTransports(self.name.clone())),
            (Some(command), None) => self.validate_stdio(command, invalid),
            (None, Some(url)) => self.validate_http(url, invalid),
        }
    }

    fn validate_stdio(
        &self,
        command: &str,
        invalid: impl Fn(&'static str, String) -> McpConfigError,
    ) -> Result<(), McpConfigError> {
        for (field, set) in [
            ("headers", !self.headers.is_empty()),
            ("bearer_token_env", self.bearer_token_env.is_some()),
            ("oauth", self.oauth.is_some()),
        ] {
            if set {
                return Err(invalid(field, "is for url servers only".to_owned()));
            }
        }
        check_value(command).map_err(|reason| invalid("command", reason))?;
        if command.is_empty() {
            return Err(invalid("command", "is empty".to_owned()));
        }
        if self.args.len() > MAX_ENTRIES {
            return Err(invalid(
                "args",
                format!("has more than {MAX_ENTRIES} entries"),
            ));
        }
        for arg in &self.args {
            check_value(arg).map_err(|reason| invalid("args", reason))?;
        }
        if self.env.len() + self.inherit_env.len() > MAX_ENTRIES {
            return Err(invalid(
                "env",
                format!("has more than {MAX_ENTRIES} entries"),
            ));
        }
        for (key, value) in &self.env {
            if !valid_env_name(key) {
                return Err(invalid(
                    "env",
                    format!("has an invalid variable name {key:?}"),
                ));
            }
            check_value(value).map_err(|reason| invalid("env", format!("{key}: {reason}")))?;
        }
        for var in &self.inherit_env {
            if !valid_env_name(var) {
                return Err(invalid(
                    "inherit_env",
                    format!("has an invalid variable name {var:?}"),
                ));
            }
        }
        Ok(())
    }

    fn validate_http(
        &self,
        url: &str,
        invalid: impl Fn(&'static str, String) -> McpConfigError,
    ) -> Result<(), McpConfigError> {
        for (field, set) in [
            ("args", !self.args.is_empty()),
            ("env", !self.env.is_empty()),
            ("inherit_env", !self.inherit_env.is_empty()),
        ] {
            if set {
                return Err(invalid(
                    field,
                    "is for command (stdio) servers only".to_owned(),
                ));
            }
        }
        http_url(url).map_err(|reason| invalid("url", reason))?;
        if self.headers.len() > MAX_ENTRIES {
            return Err(invalid(
                "headers",
                format!("has more than {MAX_ENTRIES} entries"),
            ));
        }
        for (name, value) in &self.headers {
            header(name, value).map_err(|reason| invalid("headers", reason))?;
        }
        if let Some(var) = &self.bearer_token_env
            && !valid_env_name(var)
        {
            return Err(invalid(
                "bearer_token_env",
                format!("is not a variable name: {var:?}"),
            ));
        }
        if let Some(oauth) = &self.oauth {
            if self.bearer_token_env.is_some() {
                return Err(invalid(
                    "oauth",
                    "is not allowed with bearer_token_env: the token is either fixed or \
                     obtained"
                        .to_owned(),
                ));
            }
            oauth.validate(&invalid)?;
        }
        Ok(())
    }

    /// Validates the entry and reads what it names from the environment through
    /// `lookup`: the bearer token, the inherited variables.
    pub(crate) fn endpoint(
        &self,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Endpoint, McpConfigError> {
        self.validate()?;
        let missing = |var: &str| McpConfigError::MissingEnv {
            server: self.name.clone(),
            var: var.to_owned(),
        };
        if let Some(url) = &self.url {
            let mut headers = Vec::with_capacity(self.headers.len());
            for (name, value) in &self.headers {
                // Validated above; the error cannot happen, but is reported, not unwrapped.
                headers.push(header(name, value).map_err(|reason| {
                    McpConfigError::InvalidField {
                        server: self.name.clone(),
                        field: "headers",
                        reason,
                    }
                })?);
            }
            let bearer_token = match &self.bearer_token_env {
                Some(var) => Some(lookup(var).ok_or_else(|| missing(var))?),
                None => None,
            };
            let client = crate::http::client(&self.name)?;
            let oauth = match &self.oauth {
                Some(oauth) => Some(Arc::new(OAuth::new(
                    Arc::from(self.name.as_str()),
                    url.clone(),
                    oauth.settings(&self.name, lookup)?,
                    client.clone(),
                ))),
                None => None,
            };
            return Ok(Endpoint::Http {
                client,
                url: url.clone(),
                headers,
                bearer_token,
                oauth,
            });
        }
        let command = self.command.clone().unwrap_or_default();
        let mut env = BTreeMap::new();
        for var in INHERITED_ENV {
            if let Some(value) = lookup(var) {
                env.insert((*var).to_owned(), value);
            }
        }
        for var in &self.inherit_env {
            env.insert(var.clone(), lookup(var).ok_or_else(|| missing(var))?);
        }
        env.extend(self.env.clone());
        Ok(Endpoint::Stdio {
            command,
            args: self.args.clone(),
            env,
        })
    }
}

/// `[a-zA-Z0-9_-]{1,32}`, without `__` and not ending with `_`: then the first `__` of
/// `<server>__<tool>` is always the separator, so two servers never offer the same name.
fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SERVER_NAME_BYTES
        && crate::names::valid_chars(name)
        && !name.contains("__")
        && !name.ends_with('_')
}

/// A POSIX-style variable name: `[A-Za-z_][A-Za-z0-9_]*`, at most 256 bytes.
fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && name.len() <= 256
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// An `http://host...` or `https://host...` URL within the value bound.
fn http_url(value: &str) -> Result<reqwest::Url, String> {
    check_value(value)?;
    let parsed = reqwest::Url::parse(value).map_err(|e| format!("is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err("must be http://host... or https://host...".to_owned());
    }
    Ok(parsed)
}

fn check_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(format!("is longer than {MAX_VALUE_BYTES} bytes"));
    }
    if value.contains('\0') {
        return Err("contains a NUL character".to_owned());
    }
    Ok(())
}

fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let parsed = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("has an invalid header name {name:?}"))?;
    if RESERVED_HEADERS.contains(&parsed.as_str()) {
        return Err(format!(
            "sets {name:?}, which the MCP transport sets itself (a bearer token goes in \
             `bearer_token_env`)"
        ));
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(format!("{name}: is longer than {MAX_VALUE_BYTES} bytes"));
    }
    let value =
        HeaderValue::from_str(value).map_err(|_| format!("{name}: is not a valid header value"))?;
    Ok((parsed, value))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::wildcard_enum_match_arm)]

    use super::*;

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Registry {
        mcp_servers: Vec<McpServerConfig>,
    }

    fn parse(text: &str) -> Vec<McpServerConfig> {
        toml::from_str::<Registry>(text).unwrap().mcp_servers
    }

    fn one(text: &str) -> McpServerConfig {
        parse(&format!("[[mcp_servers]]\n{text}")).remove(0)
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn the_documented_example_parses_and_validates() {
        let servers = parse(
            r#"
[[mcp_servers]]
name = "time"
command = "mcp-server-time"
args = []
env = { TZ = "UTC" }
idempotent = ["some_tool"]
timeout_ms = 30000

[[mcp_servers]]
name = "everything"
url = "http://127.0.0.1:3001/mcp"
headers = { X-Team = "a" }
bearer_token_env = "EVERYTHING_TOKEN"
"#,
        );
        assert_eq!(servers.len(), 2);
        for server in &servers {
            server.validate().unwrap();
        }
        assert_eq!(servers[0].timeout(), Duration::from_secs(30));
        assert_eq!(servers[1].timeout_ms, DEFAULT_TIMEOUT_MS);
        // A round trip through TOML keeps the entry as it was.
        let text = toml::to_string(&Registry {
            mcp_servers: servers.clone(),
        })
        .unwrap();
        assert_eq!(parse(&text), servers);
    }

    #[test]
    fn unknown_keys_are_refused() {
        let error = toml::from_str::<Registry>(
            "[[mcp_servers]]\nname = \"a\"\ncommand = \"x\"\ntimeout = 5\n",
        )
        .unwrap_err();
        assert!(error.to_string().contains("unknown field"), "{error}");
    }

    #[test]
    fn names_must_keep_the_prefix_unambiguous() {
        for bad in ["", "a__b", "a_", "a.b", "a b", "é", &"a".repeat(33)] {
            let config = one(&format!("name = {bad:?}\ncommand = \"x\""));
            assert!(
                matches!(config.validate(), Err(McpConfigError::InvalidName(ref n)) if n == bad),
                "{bad:?}"
            );
        }
        for good in ["a", "time", "my-server_2", "_x", &"a".repeat(32)] {
            one(&format!("name = {good:?}\ncommand = \"x\""))
                .validate()
                .unwrap();
        }
    }

    #[test]
    fn exactly_one_transport_and_only_its_fields() {
        assert!(matches!(
            one("name = \"a\"").validate(),
            Err(McpConfigError::NoTransport(ref n)) if n == "a"
        ));
        assert!(matches!(
            one("name = \"a\"\ncommand = \"x\"\nurl = \"http://h/mcp\"").validate(),
            Err(McpConfigError::TwoTransports(_))
        ));
        let cases = [
            ("command = \"x\"\nheaders = { A = \"b\" }", "headers"),
            (
                "command = \"x\"\nbearer_token_env = \"T\"",
                "bearer_token_env",
            ),
            ("url = \"http://h/mcp\"\nargs = [\"a\"]", "args"),
            ("url = \"http://h/mcp\"\nenv = { A = \"b\" }", "env"),
            (
                "url = \"http://h/mcp\"\ninherit_env = [\"A\"]",
                "inherit_env",
            ),
        ];
        for (text, expected) in cases {
            let error = one(&format!("name = \"srv\"\n{text}"))
                .validate()
                .unwrap_err();
            match error {
                McpConfigError::InvalidField { server, field, .. } => {
                    assert_eq!((server.as_str(), field), ("srv", expected), "{text}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn fields_are_checked_and_the_error_names_server_and_field() {
        let cases = [
            ("command = \"x\"\ntimeout_ms = 0", "timeout_ms"),
            ("command = \"x\"\ntimeout_ms = 600001", "timeout_ms"),
            ("command = \"\"", "command"),
            ("command = \"x\"\nenv = { \"A=B\" = \"c\" }", "env"),
            ("command = \"x\"\nidempotent = [\"a.b\"]", "idempotent"),
            ("command = \"x\"\nidempotent = [\"a\", \"a\"]", "idempotent"),
            ("url = \"ftp://h/x\"", "url"),
            ("url = \"not a url\"", "url"),
            (
                "url = \"http://h/mcp\"\nheaders = { Authorization = \"x\" }",
                "headers",
            ),
            (
                "url = \"http://h/mcp\"\nheaders = { \"bad name\" = \"x\" }",
                "headers",
            ),
            (
                "url = \"http://h/mcp\"\nheaders = { A = \"line\\nbreak\" }",
                "headers",
            ),
            (
                "url = \"http://h/mcp\"\nbearer_token_env = \"1X\"",
                "bearer_token_env",
            ),
        ];
        for (text, expected) in cases {
            let error = one(&format!("name = \"srv\"\n{text}"))
                .validate()
                .unwrap_err();
            let message = error.to_string();
            match error {
                McpConfigError::InvalidField { server, field, .. } => {
                    assert_eq!((server.as_str(), field), ("srv", expected), "{text}");
                    assert!(message.contains("\"srv\""), "{message}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_environment_is_read_at_start_and_secrets_stay_out_of_debug() {
        let config = one(
            "name = \"h\"\nurl = \"http://h/mcp\"\nheaders = { X-Team = \"hidden-value\" }\n\
             bearer_token_env = \"TOKEN\"",
        );
        assert!(matches!(
            config.endpoint(&no_env),
            Err(McpConfigError::MissingEnv { ref var, .. }) if var == "TOKEN"
        ));
        let lookup = |var: &str| (var == "TOKEN").then(|| "s3cret".to_owned());
        let endpoint = config.endpoint(&lookup).unwrap();
        match &endpoint {
            Endpoint::Http {
                bearer_token,
                headers,
                ..
            } => {
                assert_eq!(bearer_token.as_deref(), Some("s3cret"));
                assert_eq!(headers.len(), 1);
            }
            other => panic!("{other:?}"),
        }
        for shown in [format!("{endpoint:?}"), format!("{config:?}")] {
            assert!(
                !shown.contains("s3cret") && !shown.contains("hidden-value"),
                "{shown}"
            );
        }
    }

    #[test]
    fn an_oauth_entry_names_exactly_one_credential_and_holds_none() {
        let entry = |oauth: &str| {
            one(&format!(
                "name = \"crm\"\nurl = \"https://crm.example/mcp\"\n[mcp_servers.oauth]\n\
                 client_id = \"agentloop\"\n{oauth}"
            ))
        };
        for good in [
            "client_secret_env = \"CRM_SECRET\"",
            "client_secret_file = \"/run/secrets/crm\"\nscopes = [\"tools:read\", \"a:b/c\"]",
            "private_key_file = \"/run/k.pem\"\nsigning_algorithm = \"RS256\"",
            "private_key_env = \"KEY\"\nauthorization_server = \"https://sso.example\"",
        ] {
            entry(good).validate().unwrap();
        }
        let cases = [
            ("", "oauth"),
            (
                "client_secret_env = \"A\"\nprivate_key_file = \"/k.pem\"",
                "oauth",
            ),
            ("client_secret_env = \"1A\"", "oauth.client_secret_env"),
            ("client_secret_file = \"\"", "oauth.client_secret_file"),
            (
                "client_secret_env = \"A\"\nsigning_algorithm = \"ES256\"",
                "oauth.signing_algorithm",
            ),
            (
                "private_key_env = \"A\"\nsigning_algorithm = \"HS256\"",
                "oauth.signing_algorithm",
            ),
            (
                "client_secret_env = \"A\"\nscopes = [\"a b\"]",
                "oauth.scopes",
            ),
            ("client_secret_env = \"A\"\nscopes = [\"\"]", "oauth.scopes"),
            (
                "client_secret_env = \"A\"\nauthorization_server = \"sso\"",
                "oauth.authorization_server",
            ),
        ];
        for (text, expected) in cases {
            match entry(text).validate() {
                Err(McpConfigError::InvalidField { server, field, .. }) => {
                    assert_eq!((server.as_str(), field), ("crm", expected), "{text}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        // A secret value in the entry is not a field at all.
        let error = toml::from_str::<Registry>(
            "[[mcp_servers]]\nname = \"a\"\nurl = \"https://h/mcp\"\n[mcp_servers.oauth]\n\
             client_id = \"x\"\nclient_secret = \"s3cret\"\n",
        )
        .unwrap_err();
        assert!(error.to_string().contains("unknown field"), "{error}");
        // OAuth is for url servers, and not beside a fixed token.
        let stdio = one(
            "name = \"s\"\ncommand = \"x\"\n[mcp_servers.oauth]\nclient_id = \"x\"\n\
             client_secret_env = \"A\"",
        );
        assert!(matches!(
            stdio.validate(),
            Err(McpConfigError::InvalidField { field: "oauth", .. })
        ));
        let both = one(
            "name = \"s\"\nurl = \"https://h/mcp\"\nbearer_token_env = \"T\"\n\
             [mcp_servers.oauth]\nclient_id = \"x\"\nclient_secret_env = \"A\"",
        );
        assert!(matches!(
            both.validate(),
            Err(McpConfigError::InvalidField { field: "oauth", .. })
        ));
    }

    #[test]
    fn a_login_entry_names_its_token_file_and_at_most_a_preregistered_client() {
        let entry = |oauth: &str| {
            one(&format!(
                "name = \"gh\"\nurl = \"https://gh.example/mcp\"\n[mcp_servers.oauth]\n\
                 token_file = \"/var/lib/agentloop/gh.json\"\n{oauth}"
            ))
        };
        for good in [
            "",
            "client_id = \"pre\"",
            "client_id = \"pre\"\nclient_secret_env = \"GH_SECRET\"",
            "client_metadata_url = \"https://agent.example/client.json\"",
            "scopes = [\"repo\"]",
        ] {
            entry(good).validate().unwrap();
        }
        let cases = [
            ("private_key_file = \"/k.pem\"", "oauth"),
            ("client_secret_env = \"A\"", "oauth.client_id"),
            (
                "client_id = \"x\"\nclient_secret_env = \"A\"\nclient_secret_file = \"/s\"",
                "oauth",
            ),
            (
                "client_metadata_url = \"http://agent.example/client.json\"",
                "oauth.client_metadata_url",
            ),
            (
                "client_metadata_url = \"https://agent.example/\"",
                "oauth.client_metadata_url",
            ),
            (
                "client_id = \"x\"\nclient_metadata_url = \"https://agent.example/c.json\"",
                "oauth.client_metadata_url",
            ),
        ];
        for (text, expected) in cases {
            match entry(text).validate() {
                Err(McpConfigError::InvalidField { server, field, .. }) => {
                    assert_eq!((server.as_str(), field), ("gh", expected), "{text}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        // Client credentials need a client and may not name a document.
        let client_credentials = one(
            "name = \"c\"\nurl = \"https://c.example/mcp\"\n[mcp_servers.oauth]\n\
             client_secret_env = \"A\"",
        );
        assert!(matches!(
            client_credentials.validate(),
            Err(McpConfigError::InvalidField {
                field: "oauth.client_id",
                ..
            })
        ));
    }

    #[test]
    fn an_oauth_secret_is_read_from_its_variable_and_its_file_must_exist() {
        let config = |credential: &str| {
            one(&format!(
                "name = \"crm\"\nurl = \"https://crm.example/mcp\"\n[mcp_servers.oauth]\n\
                 client_id = \"agentloop\"\n{credential}"
            ))
        };
        let by_variable = config("client_secret_env = \"CRM_SECRET\"");
        assert!(matches!(
            by_variable.endpoint(&no_env),
            Err(McpConfigError::MissingEnv { ref var, .. }) if var == "CRM_SECRET"
        ));
        let lookup = |var: &str| (var == "CRM_SECRET").then(|| "s3cret".to_owned());
        let endpoint = by_variable.endpoint(&lookup).unwrap();
        match &endpoint {
            Endpoint::Http { oauth, .. } => assert!(oauth.is_some()),
            other => panic!("{other:?}"),
        }
        assert!(!format!("{endpoint:?}").contains("s3cret"));

        let missing = config("client_secret_file = \"/nonexistent/agentloop-secret\"");
        match missing.endpoint(&no_env) {
            Err(error @ McpConfigError::UnreadableFile { .. }) => {
                let message = error.to_string();
                assert!(message.contains("oauth.client_secret_file"), "{message}");
                assert!(
                    message.contains("/nonexistent/agentloop-secret"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_stdio_server_gets_a_minimal_environment() {
        let config = one(
            "name = \"s\"\ncommand = \"x\"\nenv = { TZ = \"UTC\", A = \"1\" }\n\
             inherit_env = [\"GITHUB_TOKEN\"]",
        );
        let lookup = |var: &str| match var {
            "PATH" => Some("/bin".to_owned()),
            "TZ" => Some("Europe/Paris".to_owned()),
            "GITHUB_TOKEN" => Some("t".to_owned()),
            "AGENTLOOP_SERVICE_TOKEN" => Some("secret".to_owned()),
            _ => None,
        };
        let Endpoint::Stdio { env, .. } = config.endpoint(&lookup).unwrap() else {
            panic!("stdio expected");
        };
        let expected: BTreeMap<String, String> = [
            ("A", "1"),
            ("GITHUB_TOKEN", "t"),
            ("PATH", "/bin"),
            ("TZ", "UTC"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(env, expected);
        assert!(matches!(
            config.endpoint(&no_env),
            Err(McpConfigError::MissingEnv { ref var, .. }) if var == "GITHUB_TOKEN"
        ));
    }
}
