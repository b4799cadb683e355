//! `agentloop mcp login`: an operator authorizes the gateway once, at a browser, for a
//! server that wants a user's consent (the OAuth authorization code grant with PKCE);
//! the gateway then keeps the tokens fresh with the refresh token, alone.
//!
//! The flow is rmcp's (discovery, registration, the authorization URL with its PKCE
//! challenge and `state`, the code exchange); this module adds what a command needs: the
//! challenge that starts discovery, a loopback redirect listener (RFC 8252), the client's
//! registration kept for refreshes, and the token file ([`crate::token_file`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rmcp::transport::auth::{
    AuthError, AuthorizationManager, AuthorizationRequest, AuthorizationSession,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use crate::config::{McpConfigError, McpServerConfig};
use crate::oauth::check_issuer;
use crate::token_file::{Client, TokenFile};

/// Largest request head the redirect listener reads.
const MAX_REQUEST_BYTES: usize = 16 * 1024;
/// Longest one connection to the redirect listener may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The name a dynamically registered client gets.
const CLIENT_NAME: &str = "agentloop";

/// Why a login did not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpLoginError {
    /// The entry is not one a login is for.
    #[error("{0}")]
    Config(#[from] McpConfigError),
    /// The entry is not a url server with `[mcp_servers.oauth]` and a `token_file`.
    #[error(
        "MCP server {0:?} has no `oauth.token_file`: a login is for a url server whose \
         `[mcp_servers.oauth]` names the file to keep its tokens in"
    )]
    NotLogin(String),
    /// The server answered without asking for a token.
    #[error("MCP server {0:?} answered without asking for a token: there is nothing to log in to")]
    NoChallenge(String),
    /// The server could not be reached, or answered something else than `401`.
    #[error("MCP server {server:?}: {reason}")]
    Server {
        /// The server's name.
        server: String,
        /// What happened.
        reason: String,
    },
    /// The redirect listener could not be opened.
    #[error("cannot listen for the browser's redirect on {address}: {reason}")]
    Listen {
        /// The address asked for.
        address: SocketAddr,
        /// Why.
        reason: String,
    },
    /// Discovery, registration or the code exchange failed.
    #[error("authorization failed: {0}")]
    Authorization(String),
    /// The authorization server sent the browser back with an error (the user declined,
    /// say).
    #[error("the authorization server refused: {0}")]
    Refused(String),
    /// No redirect arrived in time.
    #[error("no authorization arrived within {0:?}")]
    TimedOut(Duration),
}

impl From<AuthError> for McpLoginError {
    fn from(error: AuthError) -> Self {
        McpLoginError::Authorization(agentloop_proto::bounded_message(error.to_string()))
    }
}

/// What a login got.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Login {
    /// The client the gateway is at the authorization server (registered now, or the
    /// configured one).
    pub client_id: String,
    /// The scopes asked for.
    pub scopes: Vec<String>,
    /// Where the tokens are.
    pub token_file: PathBuf,
}

/// Authorizes the gateway for `config`'s server: asks the server for its challenge,
/// discovers its authorization server, registers a client unless the entry names one,
/// hands the authorization URL to `show` (for a person to open), waits up to `timeout`
/// for the browser's redirect to `listen` (loopback), exchanges the code and writes the
/// token file. `lookup` reads the environment (a configured client secret).
///
/// # Errors
///
/// Each step's failure, naming what to fix.
pub async fn login(
    config: &McpServerConfig,
    lookup: &dyn Fn(&str) -> Option<String>,
    listen: SocketAddr,
    timeout: Duration,
    show: impl FnOnce(&str),
) -> Result<Login, McpLoginError> {
    config.validate()?;
    let server = config.name.clone();
    let (Some(url), Some(oauth)) = (&config.url, &config.oauth) else {
        return Err(McpLoginError::NotLogin(server));
    };
    let Some(token_file) = oauth.token_file.clone() else {
        return Err(McpLoginError::NotLogin(server));
    };
    // The browser comes back to this address (RFC 8252 asks for loopback): anything else
    // would let another host deliver a code to it.
    if !listen.ip().is_loopback() {
        return Err(McpLoginError::Listen {
            address: listen,
            reason: "the redirect listener must be on a loopback address".to_owned(),
        });
    }
    let http = crate::http::client(&server)?;
    let challenge = challenge(&http, &server, url).await?;

    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| McpLoginError::Listen {
            address: listen,
            reason: e.to_string(),
        })?;
    let bound = listener.local_addr().map_err(|e| McpLoginError::Listen {
        address: listen,
        reason: e.to_string(),
    })?;
    let redirect_uri = format!("http://{bound}/callback");

    let mut manager = AuthorizationManager::new_allowing_private_addresses(url.as_str()).await?;
    let metadata = manager
        .resolve_metadata_from_challenge(Some(&challenge))
        .await?
        .metadata;
    check_issuer(oauth.authorization_server.as_deref(), &metadata)?;
    let takes_documents = metadata
        .additional_fields
        .get("client_id_metadata_document_supported")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    manager.set_metadata(metadata);
    let scopes = if oauth.scopes.is_empty() {
        manager.select_initial_scopes(&[]).await
    } else {
        oauth.scopes.clone()
    };

    let client = match (&oauth.client_id, &oauth.client_metadata_url) {
        (Some(client_id), _) => Client {
            client_id: client_id.clone(),
            client_secret: match oauth.client_secret(&server, lookup)? {
                Some(source) => Some(source.read().await?.expose().to_owned()),
                None => None,
            },
            redirect_uri: redirect_uri.clone(),
        },
        // The published document is the client (SEP-991): nothing to register.
        (None, Some(document)) if takes_documents => Client {
            client_id: document.clone(),
            client_secret: None,
            redirect_uri: redirect_uri.clone(),
        },
        (None, _) => {
            let scope_refs: Vec<&str> = scopes.iter().map(String::as_str).collect();
            let registered = manager
                .register_client(CLIENT_NAME, &redirect_uri, &scope_refs)
                .await?;
            Client {
                client_id: registered.client_id,
                client_secret: registered.client_secret,
                redirect_uri: redirect_uri.clone(),
            }
        }
    };
    manager.set_credential_store(TokenFile::create(token_file.clone(), client.clone()));
    let mut request = AuthorizationRequest::new(redirect_uri.as_str())
        .with_preregistered_client(client.client_id.clone());
    if let Some(secret) = &client.client_secret {
        request = request.with_client_secret(secret.clone());
    }
    if !scopes.is_empty() {
        request = request.with_scopes(scopes.clone());
    }
    let session = AuthorizationSession::new(manager, request)
        .await
        .map_err(|(_, error)| McpLoginError::from(error))?;
    show(session.get_authorization_url());

    let callback = tokio::time::timeout(timeout, redirect(&listener, bound))
        .await
        .map_err(|_| McpLoginError::TimedOut(timeout))??;
    session.handle_callback_url(&callback).await?;
    tracing::info!(
        server = %server,
        client_id = %client.client_id,
        token_file = %token_file.display(),
        "MCP server authorized"
    );
    Ok(Login {
        client_id: client.client_id,
        scopes,
        token_file,
    })
}

/// The server's `WWW-Authenticate` challenge to a request without a token: to
/// `initialize`, or, for a server that lets anyone initialize, to `tools/list` in the
/// session that opened (what the gateway sends next).
async fn challenge(
    http: &reqwest::Client,
    server: &str,
    url: &str,
) -> Result<String, McpLoginError> {
    let version = rmcp::model::ProtocolVersion::LATEST_WITH_INITIALIZE;
    let initialize = serde_json::json!({
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": CLIENT_NAME, "version": env!("CARGO_PKG_VERSION")},
        },
    });
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let mut session = None;
    for message in [initialize, initialized, list] {
        let mut request = http
            .post(url)
            .timeout(REQUEST_TIMEOUT)
            .header(
                reqwest::header::ACCEPT,
                "application/json, text/event-stream",
            )
            .header("mcp-protocol-version", version.to_string())
            .json(&message);
        if let Some(session) = &session {
            request = request.header("mcp-session-id", session);
        }
        let response = request.send().await.map_err(|e| McpLoginError::Server {
            server: server.to_owned(),
            reason: format!("cannot reach it: {}", e.without_url()),
        })?;
        let status = response.status();
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return Ok(response
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_owned());
        }
        if !status.is_success() {
            return Err(McpLoginError::Server {
                server: server.to_owned(),
                reason: format!("answered {status} to {}, not 401", message["method"]),
            });
        }
        if let Some(id) = response.headers().get("mcp-session-id") {
            session = Some(id.clone());
        }
    }
    Err(McpLoginError::NoChallenge(server.to_owned()))
}

/// Waits for the browser's request to `/callback` and answers it; its URL (with the code
/// and `state`, or the error) is what the exchange reads. Other requests (a favicon)
/// get a 404, and a connection that says nothing is dropped after a while.
async fn redirect(listener: &TcpListener, bound: SocketAddr) -> Result<String, McpLoginError> {
    loop {
        let (mut stream, _) = listener.accept().await.map_err(|e| McpLoginError::Listen {
            address: bound,
            reason: e.to_string(),
        })?;
        let Ok(Some(target)) = tokio::time::timeout(REQUEST_TIMEOUT, request_target(&mut stream))
            .await
            .map(Result::ok)
            .map(Option::flatten)
        else {
            continue;
        };
        let Ok(url) = url::Url::parse(&format!("http://{bound}{target}")) else {
            continue;
        };
        if url.path() != "/callback" {
            let _ = respond(&mut stream, "404 Not Found", "Not found.").await;
            continue;
        }
        let error = url
            .query_pairs()
            .find(|(key, _)| key == "error")
            .map(|(_, value)| value.into_owned());
        if let Some(error) = error {
            let description = url
                .query_pairs()
                .find(|(key, _)| key == "error_description")
                .map(|(_, value)| format!(": {value}"))
                .unwrap_or_default();
            let _ = respond(&mut stream, "200 OK", "agentloop was not authorized.").await;
            return Err(McpLoginError::Refused(agentloop_proto::bounded_message(
                format!("{error}{description}"),
            )));
        }
        let _ = respond(
            &mut stream,
            "200 OK",
            "agentloop is authorized; you can close this window.",
        )
        .await;
        return Ok(url.to_string());
    }
}

/// The target of a `GET` request line, once the request head has arrived.
async fn request_target(stream: &mut tokio::net::TcpStream) -> std::io::Result<Option<String>> {
    let mut head = Vec::new();
    let mut buffer = [0_u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = stream.read(&mut buffer).await?;
        if read == 0 || head.len() + read > MAX_REQUEST_BYTES {
            return Ok(None);
        }
        head.extend_from_slice(&buffer[..read]);
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    match (parts.next(), parts.next()) {
        (Some("GET"), Some(target)) if target.starts_with('/') => Ok(Some(target.to_owned())),
        _ => Ok(None),
    }
}

async fn respond(
    stream: &mut tokio::net::TcpStream,
    status: &str,
    text: &str,
) -> std::io::Result<()> {
    let body = format!("<!doctype html><title>agentloop</title><p>{text}</p>\n");
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
