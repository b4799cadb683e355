//! OAuth for a streamable HTTP server that asks for a token. The gateway has no user
//! behind it, so it either takes the client credentials grant (the MCP extension
//! SEP-1046) as a confidential client, authenticated by a secret (`client_secret_basic`
//! or `client_secret_post`) or a signed JWT (`private_key_jwt`, RFC 7523); or it uses
//! the refresh token an operator's login left in a token file (the authorization code
//! grant, [`crate::login`]).
//!
//! It is reactive, as the MCP authorization spec is: the first request goes out without a
//! token, and the server's `401` names what to do (`WWW-Authenticate`). Discovery (the
//! protected resource metadata of RFC 9728, then the authorization server's metadata of
//! RFC 8414 or OpenID Connect, and the scopes to ask for) is rmcp's; the token request is
//! made here, because a gateway holds its own credentials and rmcp's JWT signer is built
//! on a second crypto library this project does not take.
//!
//! The token is kept in memory only and renewed before it expires, after a `401` that
//! rejects it, and with a wider scope after a `403 insufficient_scope` (step-up), a
//! bounded number of times. Secrets and tokens are never logged, traced or stored:
//! [`Secret`]'s `Debug` is redacted, and errors carry the authorization server's error
//! code, never a request.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use rmcp::transport::auth::{
    AuthError, AuthorizationManager, AuthorizationMetadata, OAuthClientConfig,
    WWWAuthenticateParams,
};
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::token_file::TokenFile;

/// Longest a token request may take, connection included.
const TOKEN_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest token response read, in bytes.
const MAX_TOKEN_RESPONSE_BYTES: usize = 64 * 1024;
/// Longest access token accepted, in bytes (it travels in a header).
const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// Longest a token is used when its response gave no lifetime, and longest any is used.
const MAX_TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// A token is renewed this long before it expires (at most half its lifetime), so a
/// request is never sent with one about to lapse.
const RENEW_MARGIN: Duration = Duration::from_secs(60);
/// Most scope step-ups over the client's life: a server that keeps answering
/// `insufficient_scope` would otherwise make the gateway ask for tokens forever.
pub(crate) const MAX_SCOPE_UPGRADES: u32 = 3;
/// Longest scope a `403` may ask for, in bytes: it goes into token requests and logs.
const MAX_CHALLENGE_SCOPE_BYTES: usize = 1024;
/// Largest credential file (a secret or a PEM key) read, in bytes.
const MAX_CREDENTIAL_BYTES: u64 = 64 * 1024;
/// Lifetime of a client assertion (RFC 7523 asks for a short one).
const ASSERTION_LIFETIME_SECS: u64 = 60;

/// A credential's value: never printed.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    pub(crate) fn new(value: String) -> Secret {
        Secret(value)
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Where a credential comes from: a variable read at start, or a file read at each token
/// request, so a mounted secret that is rotated is picked up without a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    Value(Secret),
    File(PathBuf),
}

impl Source {
    /// The credential, without the line break a file usually ends with.
    pub(crate) async fn read(&self) -> Result<Secret, AuthError> {
        use tokio::io::AsyncReadExt as _;
        match self {
            Source::Value(secret) => Ok(secret.clone()),
            Source::File(path) => {
                let unreadable = |e: std::io::Error| {
                    AuthError::ClientCredentialsError(format!(
                        "cannot read the credential file {}: {e}",
                        path.display()
                    ))
                };
                let file = tokio::fs::File::open(path).await.map_err(unreadable)?;
                let mut text = String::new();
                file.take(MAX_CREDENTIAL_BYTES + 1)
                    .read_to_string(&mut text)
                    .await
                    .map_err(unreadable)?;
                if text.len() as u64 > MAX_CREDENTIAL_BYTES {
                    return Err(AuthError::ClientCredentialsError(format!(
                        "the credential file {} is larger than {MAX_CREDENTIAL_BYTES} bytes",
                        path.display()
                    )));
                }
                Ok(Secret(text.trim_end_matches(['\r', '\n']).to_owned()))
            }
        }
    }
}

/// A JWT signing algorithm for `private_key_jwt`: its JOSE name and jsonwebtoken's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Algorithm {
    name: &'static str,
    jwt: jsonwebtoken::Algorithm,
}

impl Algorithm {
    /// Every algorithm the registry accepts: those that sign with a private key (an HMAC
    /// one would put the secret on both sides).
    const ALL: [Algorithm; 9] = {
        use jsonwebtoken::Algorithm::{
            ES256, ES384, EdDSA, PS256, PS384, PS512, RS256, RS384, RS512,
        };
        [
            Algorithm {
                name: "ES256",
                jwt: ES256,
            },
            Algorithm {
                name: "ES384",
                jwt: ES384,
            },
            Algorithm {
                name: "RS256",
                jwt: RS256,
            },
            Algorithm {
                name: "RS384",
                jwt: RS384,
            },
            Algorithm {
                name: "RS512",
                jwt: RS512,
            },
            Algorithm {
                name: "PS256",
                jwt: PS256,
            },
            Algorithm {
                name: "PS384",
                jwt: PS384,
            },
            Algorithm {
                name: "PS512",
                jwt: PS512,
            },
            Algorithm {
                name: "EdDSA",
                jwt: EdDSA,
            },
        ]
    };

    /// ES256, for an entry that names none.
    pub(crate) const DEFAULT: Algorithm = Algorithm::ALL[0];

    /// The algorithm of a JOSE name the registry accepts.
    pub(crate) fn parse(name: &str) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|algorithm| algorithm.name == name)
    }

    /// Every name the registry accepts, for messages.
    pub(crate) fn names() -> Vec<&'static str> {
        Algorithm::ALL
            .iter()
            .map(|algorithm| algorithm.name)
            .collect()
    }

    /// The signing key from a PEM document (PKCS#8, or PKCS#1 for RSA).
    fn key(self, pem: &str) -> Result<jsonwebtoken::EncodingKey, AuthError> {
        use jsonwebtoken::Algorithm::{
            ES256, ES384, EdDSA, HS256, HS384, HS512, PS256, PS384, PS512, RS256, RS384, RS512,
        };
        let key = match self.jwt {
            ES256 | ES384 => jsonwebtoken::EncodingKey::from_ec_pem(pem.as_bytes()),
            EdDSA => jsonwebtoken::EncodingKey::from_ed_pem(pem.as_bytes()),
            RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => {
                jsonwebtoken::EncodingKey::from_rsa_pem(pem.as_bytes())
            }
            // Not in `ALL`: an assertion is never signed with a shared secret.
            HS256 | HS384 | HS512 => {
                return Err(AuthError::ClientCredentialsError(format!(
                    "{} does not sign with a private key",
                    self.name
                )));
            }
        };
        // The parser's message says what is wrong with the PEM, never what is in it.
        key.map_err(|e| {
            AuthError::ClientCredentialsError(format!(
                "the private key is not a {} key in PEM: {e}",
                self.name
            ))
        })
    }
}

/// How the gateway proves who it is to the authorization server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Credential {
    /// A client secret, sent as the server's metadata asks (`client_secret_basic` unless
    /// it lists only `client_secret_post`).
    Secret(Source),
    /// A private key that signs a short-lived client assertion (`private_key_jwt`).
    PrivateKey { key: Source, algorithm: Algorithm },
}

/// How the gateway gets its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Grant {
    /// Client credentials, asked for whenever a token is needed.
    ClientCredentials {
        client_id: String,
        credential: Credential,
    },
    /// An operator's login: the token file holds the client and the refresh token.
    Login { token_file: PathBuf },
}

/// What an `[mcp_servers.oauth]` entry says, once validated and with its variables read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OAuthSettings {
    pub(crate) grant: Grant,
    /// Asked for instead of the ones the server names, when set.
    pub(crate) scopes: Vec<String>,
    /// The only authorization server (its issuer) credentials may be sent to.
    pub(crate) authorization_server: Option<String>,
}

/// An access token in use.
struct Token {
    value: Secret,
    /// When to stop using it.
    renew_at: Instant,
}

/// What was learned from the server and its authorization server.
struct Discovered {
    metadata: AuthorizationMetadata,
    /// The scopes the challenge or the resource metadata named.
    scopes: Vec<String>,
    /// For a login's grant: rmcp's client, configured as at login, over the token file.
    login: Option<(AuthorizationManager, TokenFile)>,
}

#[derive(Default)]
struct State {
    discovered: Option<Discovered>,
    token: Option<Token>,
    /// Scopes added by step-ups, kept for every later token.
    upgraded: Vec<String>,
    upgrades: u32,
}

impl State {
    /// The token in use, while it is fresh and is not `rejected` (a request that was
    /// refused finds here the one another request got since).
    fn usable(&self, rejected: Option<&str>) -> Option<String> {
        let token = self.token.as_ref()?;
        (Instant::now() < token.renew_at && Some(token.value.expose()) != rejected)
            .then(|| token.value.expose().to_owned())
    }
}

/// One server's OAuth client. Cheap to share; token requests are serialised, and a
/// request that finds the token already renewed by another uses that one.
pub(crate) struct OAuth {
    server: Arc<str>,
    /// The MCP endpoint: the resource tokens are asked for (RFC 8707).
    resource: String,
    settings: OAuthSettings,
    http: reqwest::Client,
    state: Mutex<State>,
}

impl fmt::Debug for OAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuth")
            .field("resource", &self.resource)
            .field("grant", &self.settings.grant)
            .finish_non_exhaustive()
    }
}

impl OAuth {
    pub(crate) fn new(
        server: Arc<str>,
        resource: String,
        settings: OAuthSettings,
        http: reqwest::Client,
    ) -> OAuth {
        OAuth {
            server,
            resource,
            settings,
            http,
            state: Mutex::new(State::default()),
        }
    }

    /// The token to send now: the current one, renewed first when it is about to expire
    /// and the authorization server is known; `None` before the server has asked for one.
    pub(crate) async fn current(&self) -> Result<Option<String>, AuthError> {
        let mut state = self.state.lock().await;
        if let Some(token) = state.usable(None) {
            return Ok(Some(token));
        }
        if state.discovered.is_none() {
            return Ok(None);
        }
        // The token in use has run out: a login's must be refreshed.
        let stale = state.token.is_some();
        self.obtain(&mut state, stale).await.map(Some)
    }

    /// After a `401`: a new token, unless another request has got one since `rejected`
    /// was sent. The first `401` also starts discovery from its challenge.
    pub(crate) async fn renew(
        &self,
        challenge: &str,
        rejected: Option<&str>,
    ) -> Result<String, AuthError> {
        let mut state = self.state.lock().await;
        if let Some(token) = state.usable(rejected) {
            return Ok(token);
        }
        self.replace(&mut state, challenge, rejected.is_some())
            .await
    }

    /// After a `403 insufficient_scope`: a token for the scopes held so far and the ones
    /// the challenge names, at most [`MAX_SCOPE_UPGRADES`] times.
    pub(crate) async fn upgrade(
        &self,
        challenge: &str,
        rejected: Option<&str>,
    ) -> Result<String, AuthError> {
        let mut state = self.state.lock().await;
        if let Some(token) = state.usable(rejected) {
            return Ok(token);
        }
        let base = url::Url::parse(&self.resource)
            .map_err(|e| AuthError::InternalError(format!("the server URL: {e}")))?;
        let params = WWWAuthenticateParams::parse(challenge, &base);
        let required = if params.is_insufficient_scope() {
            params.scope
        } else {
            None
        };
        let Some(required) = required else {
            return Err(AuthError::InvalidScope(
                "the server refused the token (403) without naming the scope it needs".to_owned(),
            ));
        };
        if required.len() > MAX_CHALLENGE_SCOPE_BYTES {
            return Err(AuthError::InvalidScope(format!(
                "the server asks for more than {MAX_CHALLENGE_SCOPE_BYTES} bytes of scope"
            )));
        }
        if let Grant::Login { .. } = self.settings.grant {
            return Err(AuthError::InvalidScope(format!(
                "the server needs the scope {required:?}, which the login did not ask for: add \
                 it to `oauth.scopes` and run `agentloop mcp login` again"
            )));
        }
        if state.upgrades >= MAX_SCOPE_UPGRADES {
            return Err(AuthError::InvalidScope(format!(
                "the server still asks for more scope after {MAX_SCOPE_UPGRADES} step-ups"
            )));
        }
        state.upgrades += 1;
        for scope in required.split_whitespace() {
            if !state.upgraded.iter().any(|held| held == scope) {
                state.upgraded.push(scope.to_owned());
            }
        }
        tracing::info!(
            server = &*self.server,
            scope = %required,
            "MCP server asks for more scope; getting a new token"
        );
        self.replace(&mut state, challenge, false).await
    }

    /// Drops the token in use and gets another, discovering first if this is the
    /// server's first challenge.
    async fn replace(
        &self,
        state: &mut State,
        challenge: &str,
        stale: bool,
    ) -> Result<String, AuthError> {
        state.token = None;
        if state.discovered.is_none() {
            state.discovered = Some(self.discover(challenge).await?);
        }
        self.obtain(state, stale).await
    }

    /// The authorization server's metadata and the scopes to ask for, starting from the
    /// server's challenge.
    async fn discover(&self, challenge: &str) -> Result<Discovered, AuthError> {
        let manager = AuthorizationManager::new_allowing_private_addresses(&*self.resource).await?;
        let resolution = manager
            .resolve_metadata_from_challenge(Some(challenge))
            .await?;
        let metadata = resolution.metadata;
        check_issuer(self.settings.authorization_server.as_deref(), &metadata)?;
        // Client credentials need no refresh token: offline_access is not asked for.
        let scopes = manager
            .select_initial_scopes(&[])
            .await
            .into_iter()
            .filter(|scope| scope != "offline_access")
            .collect();
        let login = match &self.settings.grant {
            Grant::ClientCredentials { .. } => None,
            Grant::Login { token_file } => {
                let (file, client) = TokenFile::open(token_file.clone()).map_err(|e| {
                    AuthError::InternalError(format!(
                        "{e} (run `agentloop mcp login {}` to authorize the gateway)",
                        self.server
                    ))
                })?;
                let mut manager = manager;
                manager.set_metadata(metadata.clone());
                manager.set_credential_store(file.clone());
                let mut client_config =
                    OAuthClientConfig::new(client.client_id, client.redirect_uri);
                if let Some(secret) = client.client_secret {
                    client_config = client_config.with_client_secret(secret);
                }
                manager.configure_client(client_config)?;
                Some((manager, file))
            }
        };
        Ok(Discovered {
            metadata,
            scopes,
            login,
        })
    }

    /// Asks the authorization server for a token and keeps it; `stale` says the last
    /// one was refused or ran out (a login's token file may still hold it). A failure
    /// forgets what discovery found, so the next attempt starts over from the server's
    /// challenge (the authorization server may have moved).
    async fn obtain(&self, state: &mut State, stale: bool) -> Result<String, AuthError> {
        let token = self.request_token(state, stale).await;
        if token.is_err() {
            state.discovered = None;
        }
        token
    }

    async fn request_token(&self, state: &mut State, stale: bool) -> Result<String, AuthError> {
        let Some(discovered) = &state.discovered else {
            return Err(AuthError::AuthorizationRequired);
        };
        if let Some((manager, file)) = &discovered.login {
            return self
                .refresh(stale, manager, file)
                .await
                .map(|(value, renew_at)| {
                    state.token = Some(Token {
                        value: Secret(value.clone()),
                        renew_at,
                    });
                    value
                });
        }
        let metadata = &discovered.metadata;
        let endpoint = url::Url::parse(&metadata.token_endpoint).map_err(|e| {
            AuthError::ClientCredentialsError(format!("the token endpoint is not a URL: {e}"))
        })?;
        if !secure(&endpoint) {
            return Err(AuthError::ClientCredentialsError(
                "the token endpoint is not https (plain http is allowed on loopback only); no \
                 credentials were sent"
                    .to_owned(),
            ));
        }
        let mut scopes = if self.settings.scopes.is_empty() {
            discovered.scopes.clone()
        } else {
            self.settings.scopes.clone()
        };
        for scope in &state.upgraded {
            if !scopes.contains(scope) {
                scopes.push(scope.clone());
            }
        }

        // The credential is read (a file may be) before the form is built: the encoder
        // must not be held across an await.
        let Grant::ClientCredentials {
            client_id,
            credential,
        } = &self.settings.grant
        else {
            return Err(AuthError::InternalError(
                "not a client credentials grant".to_owned(),
            ));
        };
        let (credential, algorithm) = match credential {
            Credential::Secret(source) => (source.read().await?, None),
            Credential::PrivateKey { key, algorithm } => (key.read().await?, Some(*algorithm)),
        };
        let (authorization, body) =
            self.token_form(metadata, &scopes, client_id, &credential, algorithm)?;
        let mut request = self
            .http
            .post(endpoint.as_str())
            .timeout(TOKEN_REQUEST_TIMEOUT)
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded");
        if let Some(authorization) = authorization {
            request = request.header(AUTHORIZATION, authorization);
        }
        let response = request.body(body).send().await.map_err(|e| {
            AuthError::ClientCredentialsError(format!(
                "the token request failed: {}",
                e.without_url()
            ))
        })?;
        let status = response.status();
        let body = read_bounded(response).await?;
        if !status.is_success() {
            return Err(AuthError::ClientCredentialsError(refusal(status, &body)));
        }
        let token: TokenResponse = serde_json::from_slice(&body).map_err(|e| {
            AuthError::ClientCredentialsError(format!("the token response is not valid: {e}"))
        })?;
        if !token.token_type.eq_ignore_ascii_case("bearer") {
            return Err(AuthError::ClientCredentialsError(format!(
                "the token is of type {:?}; only bearer tokens are supported",
                agentloop_proto::prefix(&token.token_type, 32)
            )));
        }
        if token.access_token.is_empty()
            || token.access_token.len() > MAX_TOKEN_BYTES
            || HeaderValue::from_str(&token.access_token).is_err()
        {
            return Err(AuthError::ClientCredentialsError(
                "the access token is empty, too long or not printable".to_owned(),
            ));
        }
        let lifetime = token
            .expires_in
            .map_or(MAX_TOKEN_LIFETIME, Duration::from_secs)
            .min(MAX_TOKEN_LIFETIME);
        let renew_at = Instant::now() + lifetime.saturating_sub(RENEW_MARGIN.min(lifetime / 2));
        tracing::info!(
            server = &*self.server,
            scope = token.scope.as_deref().unwrap_or_default(),
            expires_in_s = lifetime.as_secs(),
            "got an access token for the MCP server"
        );
        let value = token.access_token;
        state.token = Some(Token {
            value: Secret(value.clone()),
            renew_at,
        });
        Ok(value)
    }

    /// A login's token: the one in the file while it is fresh, else (and whenever the
    /// one in use was given up) one from the refresh token, written back to the file.
    async fn refresh(
        &self,
        stale: bool,
        manager: &AuthorizationManager,
        file: &TokenFile,
    ) -> Result<(String, Instant), AuthError> {
        let value = if stale {
            let response = manager.refresh_token().await.map_err(|e| {
                if let AuthError::TokenRefreshRejected(reason)
                | AuthError::TokenRefreshFailed(reason) = &e
                {
                    AuthError::TokenRefreshFailed(format!(
                        "{reason} (if the authorization was revoked, run `agentloop mcp login \
                         {}` again)",
                        self.server
                    ))
                } else {
                    e
                }
            })?;
            response_field(&response, "access_token")
                .and_then(|v| v.as_str().map(str::to_owned))
                .ok_or_else(|| {
                    AuthError::TokenRefreshFailed(
                        "the refresh answer has no access token".to_owned(),
                    )
                })?
        } else {
            manager.get_access_token().await?
        };
        let stored = file.last();
        let lifetime = stored
            .as_ref()
            .and_then(|s| s.token_response.as_ref())
            .and_then(|response| response_field(response, "expires_in"))
            .and_then(|v| v.as_u64())
            .map(Duration::from_secs)
            .unwrap_or(MAX_TOKEN_LIFETIME)
            .min(MAX_TOKEN_LIFETIME);
        let age = stored
            .and_then(|s| s.token_received_at)
            .map(|received| {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs();
                Duration::from_secs(now.saturating_sub(received))
            })
            .unwrap_or_default();
        let left = lifetime.saturating_sub(age);
        let renew_at = Instant::now() + left.saturating_sub(RENEW_MARGIN.min(lifetime / 2));
        tracing::info!(
            server = &*self.server,
            expires_in_s = left.as_secs(),
            "using the login's access token for the MCP server"
        );
        Ok((value, renew_at))
    }

    /// The token request's `Authorization` header (for `client_secret_basic`) and form
    /// body.
    fn token_form(
        &self,
        metadata: &AuthorizationMetadata,
        scopes: &[String],
        client_id: &str,
        credential: &Secret,
        algorithm: Option<Algorithm>,
    ) -> Result<(Option<HeaderValue>, String), AuthError> {
        let mut authorization = None;
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "client_credentials");
        if !scopes.is_empty() {
            form.append_pair("scope", &scopes.join(" "));
        }
        form.append_pair("resource", &self.resource);
        match algorithm {
            None => match secret_method(metadata)? {
                SecretMethod::Basic => {
                    authorization = Some(basic_authorization(client_id, credential)?);
                }
                SecretMethod::Post => {
                    form.append_pair("client_id", client_id);
                    form.append_pair("client_secret", credential.expose());
                }
            },
            Some(algorithm) => {
                check_jwt_support(metadata, algorithm)?;
                let audience = metadata
                    .issuer
                    .clone()
                    .unwrap_or_else(|| metadata.token_endpoint.clone());
                let assertion = assertion(client_id, &audience, credential, algorithm)?;
                form.append_pair(
                    "client_assertion_type",
                    "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                );
                form.append_pair("client_assertion", assertion.expose());
            }
        }
        Ok((authorization, form.finish()))
    }
}

/// A field of a token response as RFC 6749 writes it (rmcp keeps the `oauth2` crate's
/// type, whose accessors are behind a trait it does not export).
fn response_field(
    response: &rmcp::transport::auth::OAuthTokenResponse,
    field: &str,
) -> Option<serde_json::Value> {
    serde_json::to_value(response).ok()?.get(field).cloned()
}

/// Refuses an authorization server other than the pinned one, before anything is sent.
pub(crate) fn check_issuer(
    pinned: Option<&str>,
    metadata: &AuthorizationMetadata,
) -> Result<(), AuthError> {
    let Some(pinned) = pinned else {
        return Ok(());
    };
    let issuer = metadata.issuer.as_deref().unwrap_or_default();
    if issuer.trim_end_matches('/') == pinned.trim_end_matches('/') {
        return Ok(());
    }
    Err(AuthError::ClientCredentialsError(format!(
        "the server names the authorization server {issuer:?}, not the configured {pinned:?}; \
         no credentials were sent"
    )))
}

/// `https`, or plain `http` to a loopback address (a local authorization server).
fn secure(url: &url::Url) -> bool {
    match url.scheme() {
        "https" => true,
        "http" => match url.host() {
            Some(url::Host::Domain(domain)) => domain.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        },
        _ => false,
    }
}

enum SecretMethod {
    Basic,
    Post,
}

/// `client_secret_basic` unless the server lists only `client_secret_post` (RFC 8414: a
/// server that lists nothing takes `client_secret_basic`).
fn secret_method(metadata: &AuthorizationMetadata) -> Result<SecretMethod, AuthError> {
    let Some(methods) = auth_methods(metadata) else {
        return Ok(SecretMethod::Basic);
    };
    if methods.contains(&"client_secret_basic") {
        Ok(SecretMethod::Basic)
    } else if methods.contains(&"client_secret_post") {
        Ok(SecretMethod::Post)
    } else {
        Err(AuthError::ClientCredentialsError(format!(
            "the authorization server takes no client secret (it lists {methods:?})"
        )))
    }
}

fn check_jwt_support(
    metadata: &AuthorizationMetadata,
    algorithm: Algorithm,
) -> Result<(), AuthError> {
    if let Some(methods) = auth_methods(metadata)
        && !methods.contains(&"private_key_jwt")
    {
        return Err(AuthError::ClientCredentialsError(format!(
            "the authorization server does not take private_key_jwt (it lists {methods:?})"
        )));
    }
    if let Some(algorithms) = metadata
        .additional_fields
        .get("token_endpoint_auth_signing_alg_values_supported")
        .and_then(|v| v.as_array())
        && !algorithms
            .iter()
            .any(|a| a.as_str() == Some(algorithm.name))
    {
        return Err(AuthError::ClientCredentialsError(format!(
            "the authorization server does not take {} assertions",
            algorithm.name
        )));
    }
    Ok(())
}

fn auth_methods(metadata: &AuthorizationMetadata) -> Option<Vec<&str>> {
    metadata
        .additional_fields
        .get("token_endpoint_auth_methods_supported")
        .and_then(|v| v.as_array())
        .map(|methods| methods.iter().filter_map(|m| m.as_str()).collect())
}

/// `Basic base64(id:secret)`, each form-encoded first (RFC 6749, section 2.3.1).
fn basic_authorization(client_id: &str, secret: &Secret) -> Result<HeaderValue, AuthError> {
    use base64::Engine as _;
    let encode =
        |value: &str| url::form_urlencoded::byte_serialize(value.as_bytes()).collect::<String>();
    let pair = format!("{}:{}", encode(client_id), encode(secret.expose()));
    let mut value = HeaderValue::try_from(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    ))
    .map_err(|_| {
        AuthError::ClientCredentialsError("the client secret is not printable".to_owned())
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// A client assertion (RFC 7523, section 3): issued by and about the client, for the
/// authorization server, short-lived and never reused.
fn assertion(
    client_id: &str,
    audience: &str,
    pem: &Secret,
    algorithm: Algorithm,
) -> Result<Secret, AuthError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let claims = serde_json::json!({
        "iss": client_id,
        "sub": client_id,
        "aud": audience,
        "iat": now,
        "exp": now + ASSERTION_LIFETIME_SECS,
        "jti": uuid::Uuid::new_v4().to_string(),
    });
    let header = jsonwebtoken::Header::new(algorithm.jwt);
    jsonwebtoken::encode(&header, &claims, &algorithm.key(pem.expose())?)
        .map(Secret)
        .map_err(|e| {
            AuthError::ClientCredentialsError(format!("cannot sign the client assertion: {e}"))
        })
}

/// A token endpoint's answer (RFC 6749, section 5.1); the rest is ignored.
#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    token_type: String,
    #[serde(default)]
    expires_in: Option<u64>,
    #[serde(default)]
    scope: Option<String>,
}

/// The body, up to [`MAX_TOKEN_RESPONSE_BYTES`].
async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, AuthError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| {
        AuthError::ClientCredentialsError(format!(
            "reading the token response failed: {}",
            e.without_url()
        ))
    })? {
        if body.len() + chunk.len() > MAX_TOKEN_RESPONSE_BYTES {
            return Err(AuthError::ClientCredentialsError(format!(
                "the token response is larger than {MAX_TOKEN_RESPONSE_BYTES} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Why the authorization server refused: its `error` code and description (RFC 6749,
/// section 5.2), bounded; the request is never part of it.
fn refusal(status: reqwest::StatusCode, body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Refusal {
        error: String,
        #[serde(default)]
        error_description: Option<String>,
    }
    match serde_json::from_slice::<Refusal>(body) {
        Ok(refusal) => format!(
            "the authorization server refused the token request ({status}): {}{}",
            agentloop_proto::prefix(&refusal.error, 64),
            refusal
                .error_description
                .map(|d| format!(": {}", agentloop_proto::prefix(&d, 256)))
                .unwrap_or_default()
        ),
        Err(_) => format!("the authorization server refused the token request ({status})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(methods: Option<&[&str]>) -> AuthorizationMetadata {
        let mut metadata = AuthorizationMetadata::default();
        metadata.token_endpoint = "https://sso.example/token".to_owned();
        metadata.issuer = Some("https://sso.example".to_owned());
        if let Some(methods) = methods {
            metadata.additional_fields.insert(
                "token_endpoint_auth_methods_supported".to_owned(),
                serde_json::json!(methods),
            );
        }
        metadata
    }

    #[test]
    fn a_secret_goes_as_the_metadata_says_basic_by_default() {
        for (methods, basic) in [
            (None, true),
            (
                Some(&["client_secret_basic", "client_secret_post"][..]),
                true,
            ),
            (Some(&["client_secret_post"][..]), false),
        ] {
            let method = secret_method(&metadata(methods)).unwrap();
            assert_eq!(matches!(method, SecretMethod::Basic), basic, "{methods:?}");
        }
        let error = secret_method(&metadata(Some(&["private_key_jwt"]))).err();
        assert!(matches!(error, Some(AuthError::ClientCredentialsError(_))));
        assert!(
            check_jwt_support(
                &metadata(Some(&["client_secret_basic"])),
                Algorithm::DEFAULT
            )
            .is_err()
        );
        assert!(check_jwt_support(&metadata(None), Algorithm::DEFAULT).is_ok());
    }

    #[test]
    fn basic_credentials_are_form_encoded_then_base64_and_marked_sensitive() {
        use base64::Engine as _;
        let value = basic_authorization("client:1", &Secret("p@ss word/+".to_owned())).unwrap();
        assert!(value.is_sensitive());
        let encoded = value.to_str().unwrap().strip_prefix("Basic ").unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        assert_eq!(
            String::from_utf8(decoded).unwrap(),
            "client%3A1:p%40ss+word%2F%2B"
        );
    }

    #[test]
    fn credentials_travel_over_https_or_to_loopback_only() {
        for (url, ok) in [
            ("https://sso.example/token", true),
            ("http://127.0.0.1:8080/token", true),
            ("http://[::1]/token", true),
            ("http://localhost/token", true),
            ("http://sso.example/token", false),
            ("http://10.0.0.9/token", false),
            ("ftp://sso.example/token", false),
        ] {
            assert_eq!(secure(&url::Url::parse(url).unwrap()), ok, "{url}");
        }
    }

    #[test]
    fn a_refusal_says_the_servers_error_bounded_and_never_the_request() {
        let body = serde_json::json!({
            "error": "invalid_client",
            "error_description": "x".repeat(10_000),
        });
        let message = refusal(
            reqwest::StatusCode::UNAUTHORIZED,
            body.to_string().as_bytes(),
        );
        assert!(message.contains("invalid_client"), "{message}");
        assert!(message.len() < 600, "{}", message.len());
        let message = refusal(reqwest::StatusCode::BAD_GATEWAY, b"<html>secret</html>");
        assert!(!message.contains("secret"), "{message}");
    }

    #[tokio::test]
    async fn a_credential_file_is_read_within_its_bound_without_its_line_break() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "s3cret\r\n").unwrap();
        let secret = Source::File(path.clone()).read().await.unwrap();
        assert_eq!(secret.expose(), "s3cret");
        std::fs::write(&path, vec![b'x'; 70_000]).unwrap();
        let error = Source::File(path).read().await.err().unwrap().to_string();
        assert!(error.contains("larger than"), "{error}");
    }

    #[test]
    fn secrets_do_not_print() {
        let secret = Secret("s3cret".to_owned());
        assert_eq!(format!("{secret:?}"), "<redacted>");
        let source = Source::Value(secret);
        assert!(!format!("{source:?}").contains("s3cret"));
    }

    #[test]
    fn an_assertion_is_signed_for_the_authorization_server_and_short_lived() {
        use base64::Engine as _;
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref())
        );
        let signed = assertion(
            "gateway",
            "https://sso.example",
            &Secret(pem.clone()),
            Algorithm::DEFAULT,
        )
        .unwrap();
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
        validation.set_audience(&["https://sso.example"]);
        validation.set_issuer(&["gateway"]);
        let claims = jsonwebtoken::decode::<serde_json::Value>(
            signed.expose(),
            &jsonwebtoken::DecodingKey::from_ec_der(pair.public_key().as_ref()),
            &validation,
        )
        .unwrap()
        .claims;
        assert_eq!(claims["sub"], "gateway");
        let lifetime = claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap();
        assert_eq!(lifetime, ASSERTION_LIFETIME_SECS);
        // Each assertion is new: its ID is never reused.
        let again = assertion(
            "gateway",
            "https://sso.example",
            &Secret(pem),
            Algorithm::DEFAULT,
        )
        .unwrap();
        let key = jsonwebtoken::DecodingKey::from_ec_der(pair.public_key().as_ref());
        let id = |token: &Secret| {
            jsonwebtoken::decode::<serde_json::Value>(token.expose(), &key, &validation)
                .unwrap()
                .claims["jti"]
                .clone()
        };
        assert_ne!(id(&signed), id(&again));
        // A key of another kind is refused with a message, not a panic.
        assert!(matches!(
            assertion(
                "gateway",
                "a",
                &Secret("not a key".to_owned()),
                Algorithm::parse("RS256").unwrap()
            ),
            Err(AuthError::ClientCredentialsError(_))
        ));
    }
}
