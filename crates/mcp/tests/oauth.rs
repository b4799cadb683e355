//! OAuth, against `tests/oauth_server.py` (an MCP server behind tokens and its
//! authorization server, recording every request): the gateway gets a token by the
//! client credentials grant when the server asks, authenticates as the metadata says,
//! widens its scope when a call needs more, replaces a revoked token, stops stepping up
//! after a bound, never sends credentials to an authorization server other than the
//! pinned one, and never logs a secret or a token.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use agentloop_mcp::{Health, McpExecutor, McpServerConfig, Supervision};
use agentloop_proto::v1::tool_result::Outcome;
use common::*;
use serde_json::{Value, json};

const INSTALL: &str = "apt-get install python3";

/// The test server, killed when dropped, and the record of what it was sent.
struct AuthServer {
    _child: tokio::process::Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl AuthServer {
    async fn start(flags: &[&str]) -> AuthServer {
        let dir = tempfile::tempdir().unwrap();
        let port_file = dir.path().join("port");
        let log = dir.path().join("requests.jsonl");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oauth_server.py");
        let child = tokio::process::Command::new("python3")
            .arg(&script)
            .arg(&port_file)
            .arg(&log)
            .args(flags)
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let port = eventually("the test server's port", || async {
            std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|p| p.parse().ok())
        })
        .await;
        AuthServer {
            _child: child,
            port,
            log,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Every request recorded so far, of `kind` (`token` or `mcp`).
    fn requests(&self, kind: &str) -> Vec<Value> {
        read_log(&self.log)
            .into_iter()
            .filter(|entry| entry["kind"] == kind)
            .collect()
    }

    async fn revoke_all(&self) {
        let response = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/revoke", self.port))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
    }
}

fn read_log(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The entry for the test server, with `oauth` lines after `client_id = "gateway"`.
fn entry(server: &AuthServer, oauth: &str) -> McpServerConfig {
    config(&format!(
        "name = \"crm\"\nurl = \"{}\"\ntimeout_ms = 20000\n[mcp_servers.oauth]\n\
         client_id = \"gateway\"\n{oauth}",
        server.url()
    ))
}

/// Starts an executor whose environment holds the secret in `CRM_SECRET`.
fn start_with_secret(config: McpServerConfig, secret: &str) -> Arc<McpExecutor> {
    let secret = secret.to_owned();
    McpExecutor::start_with(config, Supervision::default(), &move |var| {
        (var == "CRM_SECRET").then(|| secret.clone())
    })
    .unwrap()
}

/// The text a `whoami` call returned: the scopes of the token it was made with.
fn scopes_of(outcome: Outcome) -> String {
    output(outcome).to_string()
}

/// A `tracing` writer into a buffer the test reads.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_server_that_asks_for_a_token_gets_one_and_more_scope_when_a_call_needs_it() {
    if !available("python3", INSTALL) {
        return;
    }
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // The process's subscriber (the other tests of this binary log there too): a
    // thread's default subscriber would race with other threads over which callsites
    // are enabled.
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let server = AuthServer::start(&["--scopes", "tools:read", "--call-scope", "tools:call"]).await;
    let executor = start_with_secret(
        entry(&server, "client_secret_env = \"CRM_SECRET\""),
        "s3cret",
    );
    wait_up(&executor).await;
    let tools = describe(&executor).await;
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].name, "crm__whoami");

    // The first request went without a token; the challenge led to one, asked for with
    // the scope the server named, authenticated with HTTP Basic (the default), for the
    // server's URL as the resource.
    let mcp = server.requests("mcp");
    assert_eq!(mcp[0]["method"], "initialize");
    assert!(mcp[0]["token"].is_null(), "{mcp:?}");
    let tokens = server.requests("token");
    assert_eq!(tokens.len(), 1, "{tokens:?}");
    assert_eq!(tokens[0]["grant_type"], "client_credentials");
    assert_eq!(tokens[0]["auth"], "client_secret_basic");
    assert_eq!(tokens[0]["scope"], "tools:read");
    assert_eq!(tokens[0]["resource"], server.url());
    assert!(mcp[1..].iter().all(|r| r["token"] == "token-1"), "{mcp:?}");

    // The call needs a scope the token lacks: the server says which (403), the gateway
    // gets a token for both and the call goes through, once.
    let scopes = scopes_of(call(&executor, "crm__whoami", json!({})).await.unwrap());
    assert!(
        scopes.contains("tools:call") && scopes.contains("tools:read"),
        "{scopes}"
    );
    let tokens = server.requests("token");
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    assert_eq!(tokens[1]["scope"], "tools:read tools:call");
    let calls: Vec<Value> = server
        .requests("mcp")
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 2, "refused once, then done: {calls:?}");
    assert_eq!(calls[1]["token"], "token-2");

    executor.shutdown().await;
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logged.contains("got an access token"), "{logged}");
    for secret in ["s3cret", "token-1", "token-2", "Basic "] {
        assert!(
            !logged.contains(secret),
            "{secret} is in the log:\n{logged}"
        );
    }
}

#[tokio::test]
async fn a_revoked_token_is_replaced_and_the_call_goes_through() {
    if !available("python3", INSTALL) {
        return;
    }
    let server = AuthServer::start(&[]).await;
    let executor = start_with_secret(
        entry(&server, "client_secret_env = \"CRM_SECRET\""),
        "s3cret",
    );
    wait_up(&executor).await;
    server.revoke_all().await;
    let scopes = scopes_of(call(&executor, "crm__whoami", json!({})).await.unwrap());
    assert!(scopes.contains("tools:read"), "{scopes}");
    assert_eq!(server.requests("token").len(), 2);
    let calls: Vec<Value> = server
        .requests("mcp")
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    let presented: Vec<&Value> = calls.iter().map(|r| &r["token"]).collect();
    assert_eq!(presented, [&json!("token-1"), &json!("token-2")]);
    executor.shutdown().await;
}

#[tokio::test]
async fn a_secret_goes_in_the_body_when_the_server_takes_only_that() {
    if !available("python3", INSTALL) {
        return;
    }
    let server = AuthServer::start(&["--methods", "client_secret_post"]).await;
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("secret");
    // As a mounted secret usually is: with a line break at the end.
    std::fs::write(&secret_file, "s3cret\n").unwrap();
    let executor = start_with_secret(
        entry(
            &server,
            &format!(
                "client_secret_file = {:?}",
                secret_file.display().to_string()
            ),
        ),
        "unused",
    );
    wait_up(&executor).await;
    let tokens = server.requests("token");
    assert_eq!(tokens.len(), 1);
    assert_eq!(tokens[0]["auth"], "client_secret_post");
    executor.shutdown().await;
}

#[tokio::test]
async fn a_private_key_signs_an_assertion_for_the_authorization_server() {
    use base64::Engine as _;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
    if !available("python3", INSTALL) {
        return;
    }
    let server =
        AuthServer::start(&["--methods", "private_key_jwt", "--issuer-path", "/sso"]).await;
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key.pem");
    let mut pem = std::fs::File::create(&key_file).unwrap();
    writeln!(
        pem,
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----",
        base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref())
    )
    .unwrap();
    let executor = start_with_secret(
        entry(
            &server,
            &format!(
                "private_key_file = {:?}\nsigning_algorithm = \"ES256\"",
                key_file.display().to_string()
            ),
        ),
        "unused",
    );
    wait_up(&executor).await;
    let tokens = server.requests("token");
    assert_eq!(tokens.len(), 1);
    assert_eq!(tokens[0]["auth"], "private_key_jwt");
    assert_eq!(
        tokens[0]["assertion_type"],
        "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    );
    // Signed by the key, about and by the client, for the issuer (the authorization
    // server), valid for a minute.
    let issuer = format!("http://127.0.0.1:{}/sso", server.port);
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    validation.set_audience(&[issuer.as_str()]);
    validation.set_issuer(&["gateway"]);
    let claims = jsonwebtoken::decode::<Value>(
        tokens[0]["assertion"].as_str().unwrap(),
        &jsonwebtoken::DecodingKey::from_ec_der(pair.public_key().as_ref()),
        &validation,
    )
    .unwrap()
    .claims;
    assert_eq!(claims["sub"], "gateway");
    assert!(claims["jti"].is_string());
    executor.shutdown().await;
}

#[tokio::test]
async fn credentials_go_to_the_pinned_authorization_server_only() {
    if !available("python3", INSTALL) {
        return;
    }
    let server = AuthServer::start(&[]).await;
    let executor = start_with_secret(
        entry(
            &server,
            "client_secret_env = \"CRM_SECRET\"\nauthorization_server = \"https://sso.example\"",
        ),
        "s3cret",
    );
    let down = wait_for(&executor, "the refusal", |h| {
        matches!(h, Health::Down { .. })
    })
    .await;
    let Health::Down { reason, .. } = down else {
        unreachable!()
    };
    assert!(reason.contains("https://sso.example"), "{reason}");
    assert!(server.requests("token").is_empty());
    executor.shutdown().await;
}

#[tokio::test]
async fn a_server_that_keeps_asking_for_more_scope_is_refused_after_three_step_ups() {
    if !available("python3", INSTALL) {
        return;
    }
    let server = AuthServer::start(&["--endless-scope"]).await;
    let executor = start_with_secret(
        entry(&server, "client_secret_env = \"CRM_SECRET\""),
        "s3cret",
    );
    wait_up(&executor).await;
    for _ in 0..3 {
        let refused = call(&executor, "crm__whoami", json!({})).await;
        assert!(!matches!(refused, Ok(Outcome::Output(_))), "{refused:?}");
    }
    // One token to connect, then three step-ups in all, however many calls follow.
    assert_eq!(server.requests("token").len(), 4);
    executor.shutdown().await;
}

#[tokio::test]
async fn a_refused_client_is_down_with_the_servers_reason_and_retried() {
    if !available("python3", INSTALL) {
        return;
    }
    let server = AuthServer::start(&[]).await;
    let executor = start_with_secret(
        entry(&server, "client_secret_env = \"CRM_SECRET\""),
        "not-the-secret-42",
    );
    let down = wait_for(&executor, "the refusal", |h| {
        matches!(h, Health::Down { .. })
    })
    .await;
    let Health::Down { reason, .. } = down else {
        unreachable!()
    };
    assert!(reason.contains("invalid_client"), "{reason}");
    assert!(!reason.contains("not-the-secret-42"), "{reason}");
    // Reconnecting asks again.
    eventually("a second token request", || async {
        (server.requests("token").len() >= 2).then_some(())
    })
    .await;
    executor.shutdown().await;
}

/// The access and refresh tokens in a token file.
fn stored_tokens(path: &Path) -> (Value, Value) {
    let file: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let response = &file["credentials"]["token_response"];
    assert!(response["refresh_token"].is_string(), "{file}");
    (
        response["access_token"].clone(),
        response["refresh_token"].clone(),
    )
}

/// Runs `agentloop mcp login`'s flow for `config`, with a test client as the browser:
/// it opens the URL and follows the redirect back to the login's listener.
async fn login_with_browser(config: &McpServerConfig) -> agentloop_mcp::Login {
    let browser = Arc::new(Mutex::new(None));
    let opened = Arc::clone(&browser);
    let login = agentloop_mcp::login(
        config,
        &|_| None,
        "127.0.0.1:0".parse().unwrap(),
        PATIENCE,
        move |url: &str| {
            let url = url.to_owned();
            *opened.lock().unwrap() = Some(tokio::spawn(async move {
                reqwest::get(url).await.unwrap().status()
            }));
        },
    )
    .await
    .unwrap();
    let visit = browser.lock().unwrap().take().unwrap();
    assert!(visit.await.unwrap().is_success());
    login
}

#[tokio::test]
async fn a_login_leaves_a_token_file_that_the_gateway_uses_and_refreshes() {
    if !available("python3", INSTALL) {
        return;
    }
    let server = AuthServer::start(&["--login", "--scopes", "tools:read,offline_access"]).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("crm.json");
    let entry = config(&format!(
        "name = \"crm\"\nurl = \"{}\"\n[mcp_servers.oauth]\ntoken_file = {:?}",
        server.url(),
        token_file.display().to_string()
    ));
    let login = login_with_browser(&entry).await;

    // No client was configured: the login registered one, asked for the scopes the
    // server named with PKCE (S256) and for the server as the resource, and kept the
    // tokens in a file only its owner reads.
    assert_eq!(login.client_id, "registered-1");
    let authorize = read_log(&server.log)
        .into_iter()
        .find(|entry| entry["kind"] == "authorize")
        .unwrap();
    assert_eq!(authorize["code_challenge_method"], "S256");
    assert_eq!(authorize["resource"], server.url());
    assert_eq!(authorize["scope"], "tools:read offline_access");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let stored = stored_tokens(&token_file);

    // The gateway sends the login's token...
    let executor = start(entry, Supervision::default());
    wait_up(&executor).await;
    let scopes = scopes_of(call(&executor, "crm__whoami", json!({})).await.unwrap());
    assert!(scopes.contains("tools:read"), "{scopes}");
    let presented: Vec<Value> = server
        .requests("mcp")
        .into_iter()
        .filter_map(|r| r["token"].as_str().map(|t| json!(t)))
        .collect();
    assert!(presented.iter().all(|t| *t == stored.0), "{presented:?}");

    // ...and once it is revoked, refreshes with the refresh token, writes the rotated
    // one back, and the call goes through.
    server.revoke_all().await;
    call(&executor, "crm__whoami", json!({})).await.unwrap();
    let grants: Vec<Value> = server
        .requests("token")
        .into_iter()
        .map(|r| r["grant_type"].clone())
        .collect();
    assert_eq!(
        grants,
        [json!("authorization_code"), json!("refresh_token")]
    );
    let rotated = stored_tokens(&token_file);
    assert_ne!(rotated.0, stored.0);
    assert_ne!(rotated.1, stored.1);
    executor.shutdown().await;

    // A gateway started later reads the rotated refresh token, not the used one.
    server.revoke_all().await;
    let later = start(
        config(&format!(
            "name = \"crm\"\nurl = \"{}\"\n[mcp_servers.oauth]\ntoken_file = {:?}",
            server.url(),
            token_file.display().to_string()
        )),
        Supervision::default(),
    );
    wait_up(&later).await;
    call(&later, "crm__whoami", json!({})).await.unwrap();
    later.shutdown().await;
}

#[tokio::test]
async fn a_server_without_a_login_is_down_saying_how_to_log_in() {
    if !available("python3", INSTALL) {
        return;
    }
    let server = AuthServer::start(&["--login"]).await;
    let dir = tempfile::tempdir().unwrap();
    let executor = start(
        config(&format!(
            "name = \"crm\"\nurl = \"{}\"\n[mcp_servers.oauth]\ntoken_file = {:?}",
            server.url(),
            dir.path().join("missing.json").display().to_string()
        )),
        Supervision::default(),
    );
    let down = wait_for(&executor, "the refusal", |h| {
        matches!(h, Health::Down { .. })
    })
    .await;
    let Health::Down { reason, .. } = down else {
        unreachable!()
    };
    assert!(reason.contains("agentloop mcp login crm"), "{reason}");
    executor.shutdown().await;
}

#[tokio::test]
async fn a_login_is_refused_for_an_entry_without_a_token_file_or_off_loopback() {
    let entry = config(
        "name = \"crm\"\nurl = \"https://crm.example/mcp\"\n[mcp_servers.oauth]\n\
         client_id = \"gateway\"\nclient_secret_env = \"CRM_SECRET\"",
    );
    let not_login = agentloop_mcp::login(
        &entry,
        &|_| Some("s3cret".to_owned()),
        "127.0.0.1:0".parse().unwrap(),
        PATIENCE,
        |_: &str| panic!("nothing to open"),
    )
    .await;
    assert!(
        matches!(not_login, Err(agentloop_mcp::McpLoginError::NotLogin(ref n)) if n == "crm"),
        "{not_login:?}"
    );
    let login = config(
        "name = \"crm\"\nurl = \"https://crm.example/mcp\"\n[mcp_servers.oauth]\n\
         token_file = \"/nonexistent/crm.json\"",
    );
    let off_loopback = agentloop_mcp::login(
        &login,
        &|_| None,
        "0.0.0.0:0".parse().unwrap(),
        PATIENCE,
        |_: &str| panic!("nothing to open"),
    )
    .await;
    assert!(
        matches!(
            off_loopback,
            Err(agentloop_mcp::McpLoginError::Listen { .. })
        ),
        "{off_loopback:?}"
    );
}
