//! Keys from a JWKS URL, served by a real local HTTP server: the first fetch, rotation
//! through the unknown-kid fetch and its rate limit, and a provider that is down.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use agentloop_auth::testing::{Alg, TokenIssuer};
use agentloop_auth::{AuthConfig, AuthConfigError, AuthError, Authenticator};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// Makes `server` answer `GET /jwks` with `body` and `status`, replacing what it served.
async fn serve(server: &MockServer, status: u16, body: String) {
    server.reset().await;
    Mock::given(method("GET"))
        .and(path("/jwks"))
        .respond_with(
            ResponseTemplate::new(status)
                .insert_header("content-type", "application/json")
                .set_body_string(body),
        )
        .mount(server)
        .await;
}

fn config(url: String, issuer: &TokenIssuer) -> AuthConfig {
    let dir = tempfile::tempdir().unwrap();
    AuthConfig {
        jwks_file: None,
        jwks_url: Some(url),
        ..issuer.write_key_source(dir.path())
    }
}

async fn fetches(server: &MockServer) -> usize {
    server.received_requests().await.unwrap().len()
}

#[tokio::test]
async fn verifies_with_keys_from_the_url() {
    for alg in [Alg::Rs256, Alg::Es256, Alg::EdDsa] {
        let server = MockServer::start().await;
        let issuer = TokenIssuer::new(alg);
        serve(&server, 200, issuer.jwks_json()).await;
        let auth = Authenticator::from_config(&config(format!("{}/jwks", server.uri()), &issuer))
            .await
            .unwrap()
            .unwrap();
        let identity = auth
            .verify(&issuer.token("alice", "acme", &["approver"]))
            .await
            .unwrap();
        assert_eq!(identity.actor, "alice", "{alg:?}");
        assert_eq!(identity.roles, vec!["approver".to_owned()]);
        assert_eq!(
            fetches(&server).await,
            1,
            "one fetch at start, none per token"
        );
    }
}

#[tokio::test]
async fn a_rotated_key_is_fetched_on_its_first_token_at_most_once_per_10_s() {
    let server = MockServer::start().await;
    let old = TokenIssuer::new(Alg::Es256);
    let new = TokenIssuer::new(Alg::Es256);
    serve(&server, 200, old.jwks_json()).await;
    let auth = Authenticator::from_config(&config(format!("{}/jwks", server.uri()), &old))
        .await
        .unwrap()
        .unwrap();
    assert!(auth.verify(&old.token("alice", "acme", &[])).await.is_ok());

    // The provider rotates: it now serves only the new key.
    serve(&server, 200, new.jwks_json()).await;
    let identity = auth.verify(&new.token("bob", "acme", &[])).await.unwrap();
    assert_eq!(identity.actor, "bob");
    assert_eq!(fetches(&server).await, 1, "one fetch since the rotation");

    // The old key is gone from the set; its tokens, and tokens with made-up kids, cause
    // no further fetch within 10 s.
    let stranger = TokenIssuer::new(Alg::Es256);
    for token in [
        old.token("alice", "acme", &[]),
        stranger.token("eve", "acme", &[]),
    ] {
        assert_eq!(
            auth.verify(&token).await,
            Err(AuthError::Rejected("unknown signing key"))
        );
    }
    assert_eq!(fetches(&server).await, 1, "rate-limited");
    assert!(auth.verify(&new.token("bob", "acme", &[])).await.is_ok());
}

#[tokio::test]
async fn a_failed_refetch_keeps_the_keys() {
    let server = MockServer::start().await;
    let issuer = TokenIssuer::new(Alg::EdDsa);
    serve(&server, 200, issuer.jwks_json()).await;
    let auth = Authenticator::from_config(&config(format!("{}/jwks", server.uri()), &issuer))
        .await
        .unwrap()
        .unwrap();

    serve(&server, 503, String::new()).await;
    let stranger = TokenIssuer::new(Alg::EdDsa);
    assert_eq!(
        auth.verify(&stranger.token("eve", "acme", &[])).await,
        Err(AuthError::Rejected("unknown signing key"))
    );
    assert_eq!(fetches(&server).await, 1, "the unknown kid was looked up");
    assert!(
        auth.verify(&issuer.token("alice", "acme", &[]))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn the_service_does_not_start_without_keys() {
    let issuer = TokenIssuer::new(Alg::EdDsa);

    // Nothing listens on the port.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/jwks");
    let error = Authenticator::from_config(&config(url.clone(), &issuer))
        .await
        .unwrap_err();
    assert!(matches!(error, AuthConfigError::Fetch { .. }), "{error}");
    assert!(
        error
            .to_string()
            .starts_with(&format!("cannot fetch auth.jwks_url {url}: ")),
        "{error}"
    );

    let server = MockServer::start().await;
    let url = format!("{}/jwks", server.uri());
    serve(&server, 500, "oops".into()).await;
    let error = Authenticator::from_config(&config(url.clone(), &issuer))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("HTTP status 500"), "{error}");

    serve(&server, 200, r#"{"keys":[]}"#.into()).await;
    let error = Authenticator::from_config(&config(url.clone(), &issuer))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            AuthConfigError::Jwks {
                key: "auth.jwks_url",
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("no usable key"), "{error}");

    serve(
        &server,
        200,
        format!("{{\"keys\":[],\"pad\":\"{}\"}}", "x".repeat(1 << 20)),
    )
    .await;
    let error = Authenticator::from_config(&config(url, &issuer))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("larger than 1048576 bytes"),
        "{error}"
    );
}

#[tokio::test]
async fn messages_do_not_show_url_credentials() {
    let server = MockServer::start().await;
    serve(&server, 401, String::new()).await;
    let issuer = TokenIssuer::new(Alg::EdDsa);
    let address = server.address();
    let url = format!("http://user:hunter2@{address}/jwks?token=qwerty");
    let error = Authenticator::from_config(&config(url, &issuer))
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("HTTP status 401"), "{message}");
    assert!(message.contains(&format!("{address}/jwks")), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
    assert!(!message.contains("qwerty"), "{message}");
}

#[tokio::test]
async fn redirects_are_followed_but_not_forever() {
    let server = MockServer::start().await;
    let issuer = TokenIssuer::new(Alg::EdDsa);
    serve(&server, 200, issuer.jwks_json()).await;
    Mock::given(method("GET"))
        .and(path("/moved"))
        .respond_with(ResponseTemplate::new(302).insert_header("location", "/jwks"))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/loop"))
        .respond_with(ResponseTemplate::new(302).insert_header("location", "/loop"))
        .mount(&server)
        .await;
    let moved = config(format!("{}/moved", server.uri()), &issuer);
    let auth = Authenticator::from_config(&moved).await.unwrap().unwrap();
    assert!(
        auth.verify(&issuer.token("alice", "acme", &[]))
            .await
            .is_ok()
    );

    let looping = config(format!("{}/loop", server.uri()), &issuer);
    let error = Authenticator::from_config(&looping).await.unwrap_err();
    assert!(error.to_string().contains("too many redirects"), "{error}");
}
