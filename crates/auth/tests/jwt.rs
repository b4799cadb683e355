//! JWT verification from a secret file or a JWKS file: every algorithm round-trips, and
//! every way a token can be wrong is rejected with the right reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use agentloop_auth::testing::{AUDIENCE, Alg, ISSUER, TokenIssuer, now_s};
use agentloop_auth::{
    AuthConfig, AuthConfigError, AuthError, AuthMode, Authenticator, FileProblem, Identity,
    MAX_TOKEN_BYTES,
};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use tempfile::TempDir;
use tonic::metadata::MetadataMap;

struct Setup {
    _dir: TempDir,
    issuer: TokenIssuer,
    auth: Authenticator,
}

async fn setup(alg: Alg) -> Setup {
    setup_with(TokenIssuer::new(alg), |_| {}).await
}

async fn setup_with(issuer: TokenIssuer, change: impl FnOnce(&mut AuthConfig)) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let mut config = issuer.write_key_source(dir.path());
    change(&mut config);
    let auth = Authenticator::from_config(&config).await.unwrap().unwrap();
    Setup {
        _dir: dir,
        issuer,
        auth,
    }
}

/// An authenticator whose JWKS file holds exactly `jwks`.
async fn with_jwks(jwks: Value) -> (TempDir, Authenticator) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    std::fs::write(&path, jwks.to_string()).unwrap();
    let config = AuthConfig {
        mode: AuthMode::Jwt,
        jwks_file: Some(path),
        issuer: Some(ISSUER.to_owned()),
        audience: Some(AUDIENCE.to_owned()),
        ..AuthConfig::default()
    };
    let auth = Authenticator::from_config(&config).await.unwrap().unwrap();
    (dir, auth)
}

/// Valid claims for `alice` in `acme`, with `changes` merged in (`null` removes a claim).
fn claims(changes: Value) -> Value {
    let now = now_s();
    let mut claims = json!({
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice",
        "tenant": "acme",
        "roles": ["viewer"],
        "iat": now,
        "exp": now + 600,
    });
    for (name, value) in changes.as_object().unwrap() {
        if value.is_null() {
            claims.as_object_mut().unwrap().remove(name);
        } else {
            claims[name] = value.clone();
        }
    }
    claims
}

async fn rejection(auth: &Authenticator, token: &str) -> &'static str {
    match auth.verify(token).await {
        Err(AuthError::Rejected(reason)) => reason,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

fn bearer(value: &str) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    metadata.insert("authorization", value.parse().unwrap());
    metadata
}

fn b64(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(value.to_string())
}

#[tokio::test]
async fn every_algorithm_round_trips() {
    for alg in Alg::ALL {
        let s = setup(alg).await;
        let token = s.issuer.token("alice", "acme", &["approver", "viewer"]);
        let expected = Identity {
            actor: "alice".into(),
            tenant: "acme".into(),
            roles: vec!["approver".into(), "viewer".into()],
        };
        assert_eq!(s.auth.verify(&token).await.unwrap(), expected, "{alg:?}");
        let identity = s
            .auth
            .authenticate(&bearer(&format!("Bearer {token}")))
            .await
            .unwrap();
        assert_eq!(identity, expected, "{alg:?}");
        assert!(identity.has_role(s.auth.approver_role()), "{alg:?}");
    }
}

#[tokio::test]
async fn roles_are_optional_and_identity_strings_may_look_like_paths() {
    let s = setup(Alg::EdDsa).await;
    let token = s
        .issuer
        .token_with(claims(json!({"roles": null, "tenant": "../../etc"})));
    let identity = s.auth.verify(&token).await.unwrap();
    assert_eq!(identity.tenant, "../../etc");
    assert!(identity.roles.is_empty());
    assert!(!identity.has_role("approver"));
}

#[tokio::test]
async fn hs256_ignores_kid() {
    let s = setup(Alg::Hs256).await;
    let secret = hs256_secret(&s.issuer);
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    let token = jsonwebtoken::encode(
        &header,
        &claims(json!({})),
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap();
    assert_eq!(s.auth.verify(&token).await.unwrap().actor, "alice");
    let shown = format!("{:?}", s.auth);
    assert!(shown.contains(ISSUER), "{shown}");
    assert!(
        !shown.contains(secret.trim()),
        "the secret stays out of Debug: {shown}"
    );
}

#[tokio::test]
async fn metadata_without_a_bearer_token_is_refused() {
    let s = setup(Alg::Hs256).await;
    assert_eq!(
        s.auth.authenticate(&MetadataMap::new()).await,
        Err(AuthError::Missing)
    );
    let token = s.issuer.token("alice", "acme", &[]);
    for value in [
        format!("Basic {token}"),
        token.clone(),
        "Bearer ".into(),
        "Bearer".into(),
    ] {
        assert_eq!(
            s.auth.authenticate(&bearer(&value)).await,
            Err(AuthError::Malformed),
            "{value}"
        );
    }
    for garbage in [
        "Bearer garbage",
        "Bearer a.b.c",
        "Bearer ...",
        "Bearer e30.e30.e30",
    ] {
        assert!(
            matches!(
                s.auth.authenticate(&bearer(garbage)).await,
                Err(AuthError::Rejected(_))
            ),
            "{garbage}"
        );
    }
}

#[tokio::test]
async fn alg_none_is_rejected() {
    for alg in [Alg::Hs256, Alg::EdDsa] {
        let s = setup(alg).await;
        let payload = b64(&claims(json!({})));
        for header in [
            json!({"alg": "none"}),
            json!({"alg": "none", "typ": "JWT", "kid": s.issuer.kid()}),
            json!({"alg": "None", "kid": s.issuer.kid()}),
        ] {
            let token = format!("{}.{payload}.", b64(&header));
            rejection(&s.auth, &token).await;
            let real = s.issuer.token_with(claims(json!({})));
            let real_signature = real.rsplit('.').next().unwrap();
            let token = format!("{}.{payload}.{real_signature}", b64(&header));
            rejection(&s.auth, &token).await;
        }
    }
}

#[tokio::test]
async fn another_key_of_the_same_algorithm_is_a_bad_signature() {
    let s = setup(Alg::Hs256).await;
    let other = TokenIssuer::new(Alg::Hs256);
    let token = other.token("alice", "acme", &[]);
    assert_eq!(rejection(&s.auth, &token).await, "bad signature");

    for alg in [Alg::Rs256, Alg::Es256, Alg::EdDsa] {
        let trusted = TokenIssuer::new(alg);
        let forger = TokenIssuer::new(alg);
        // The trusted public key, published under the forger's kid: the kid matches, the
        // signature does not.
        let mut jwk = trusted.jwk();
        jwk["kid"] = json!(forger.kid());
        let (_dir, auth) = with_jwks(json!({ "keys": [jwk] })).await;
        let forged = forger.token("alice", "acme", &[]);
        assert_eq!(rejection(&auth, &forged).await, "bad signature", "{alg:?}");
    }
}

#[tokio::test]
async fn a_payload_changed_after_signing_is_a_bad_signature() {
    for alg in Alg::ALL {
        let s = setup(alg).await;
        let token = s.issuer.token("alice", "acme", &[]);
        let parts: Vec<&str> = token.split('.').collect();
        let forged_payload = b64(&claims(json!({"sub": "mallory", "roles": ["approver"]})));
        let forged = format!("{}.{forged_payload}.{}", parts[0], parts[2]);
        assert_eq!(
            rejection(&s.auth, &forged).await,
            "bad signature",
            "{alg:?}"
        );
        // And a flipped signature byte.
        let mut signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        signature[0] ^= 1;
        let flipped = format!(
            "{}.{}.{}",
            parts[0],
            parts[1],
            URL_SAFE_NO_PAD.encode(signature)
        );
        assert_eq!(
            rejection(&s.auth, &flipped).await,
            "bad signature",
            "{alg:?}"
        );
    }
}

#[tokio::test]
async fn expiry_and_not_before_honour_the_leeway() {
    let s = setup(Alg::Es256).await;
    let now = now_s();
    let issue = |changes| s.issuer.token_with(claims(changes));

    let expired = issue(json!({"exp": now - 120}));
    assert_eq!(rejection(&s.auth, &expired).await, "token expired");
    let just_expired = issue(json!({"exp": now - 10}));
    assert!(
        s.auth.verify(&just_expired).await.is_ok(),
        "within the 30 s leeway"
    );

    let early = issue(json!({"nbf": now + 120}));
    assert_eq!(rejection(&s.auth, &early).await, "token not yet valid");
    let almost = issue(json!({"nbf": now + 10}));
    assert!(
        s.auth.verify(&almost).await.is_ok(),
        "within the 30 s leeway"
    );

    let no_exp = issue(json!({"exp": null}));
    assert_eq!(rejection(&s.auth, &no_exp).await, "missing exp claim");
    let text_exp = issue(json!({"exp": "tomorrow"}));
    assert_eq!(rejection(&s.auth, &text_exp).await, "missing exp claim");

    let strict = setup_with(TokenIssuer::new(Alg::Es256), |c| c.leeway_s = 0).await;
    let token = strict.issuer.token_with(claims(json!({"exp": now - 10})));
    assert_eq!(rejection(&strict.auth, &token).await, "token expired");
}

#[tokio::test]
async fn issuer_and_audience_must_match() {
    let s = setup(Alg::EdDsa).await;
    let issue = |changes| s.issuer.token_with(claims(changes));
    assert_eq!(
        rejection(&s.auth, &issue(json!({"aud": "other"}))).await,
        "wrong audience"
    );
    assert_eq!(
        rejection(&s.auth, &issue(json!({"aud": ["other"]}))).await,
        "wrong audience"
    );
    assert_eq!(
        rejection(&s.auth, &issue(json!({"aud": null}))).await,
        "missing aud claim"
    );
    assert!(
        s.auth
            .verify(&issue(json!({"aud": ["other", AUDIENCE]})))
            .await
            .is_ok(),
        "a list of audiences containing ours"
    );
    assert_eq!(
        rejection(&s.auth, &issue(json!({"iss": "https://evil.test"}))).await,
        "wrong issuer"
    );
    assert_eq!(
        rejection(&s.auth, &issue(json!({"iss": null}))).await,
        "missing iss claim"
    );
}

#[tokio::test]
async fn identity_claims_are_required_and_checked() {
    let s = setup(Alg::Hs256).await;
    let issue = |changes| s.issuer.token_with(claims(changes));
    assert_eq!(
        rejection(&s.auth, &issue(json!({"sub": null}))).await,
        "missing sub claim"
    );
    assert_eq!(
        rejection(&s.auth, &issue(json!({"sub": ""}))).await,
        "invalid sub claim"
    );
    assert_eq!(
        rejection(&s.auth, &issue(json!({"sub": "a b"}))).await,
        "invalid sub claim"
    );
    assert_eq!(
        rejection(&s.auth, &issue(json!({"tenant": null}))).await,
        "missing tenant claim"
    );
    for not_a_string in [
        json!(7),
        json!(["acme"]),
        json!({"id": "acme"}),
        json!(true),
    ] {
        assert_eq!(
            rejection(&s.auth, &issue(json!({ "tenant": not_a_string }))).await,
            "tenant claim is not a string"
        );
    }
    for bad in [
        "",
        "ac me",
        "ac\"me",
        "ac'me",
        "ac\nme",
        "ac\u{7f}me",
        "acmé",
        &"t".repeat(129),
    ] {
        assert_eq!(
            rejection(&s.auth, &issue(json!({ "tenant": bad }))).await,
            "invalid tenant claim",
            "{bad:?}"
        );
    }
    for bad_roles in [json!("approver"), json!([1]), json!(["a b"]), json!([""])] {
        assert_eq!(
            rejection(&s.auth, &issue(json!({ "roles": bad_roles }))).await,
            "invalid roles claim"
        );
    }
}

#[tokio::test]
async fn custom_claim_names() {
    let s = setup_with(TokenIssuer::new(Alg::Hs256), |c| {
        c.tenant_claim = "org".into();
        c.roles_claim = "https://agentloop/groups".into();
        c.approver_role = "release-manager".into();
    })
    .await;
    let token = s.issuer.token_with(claims(json!({
        "tenant": null,
        "org": "acme",
        "roles": ["ignored"],
        "https://agentloop/groups": ["release-manager"],
    })));
    let identity = s.auth.verify(&token).await.unwrap();
    assert_eq!(identity.tenant, "acme");
    assert_eq!(identity.roles, vec!["release-manager".to_owned()]);
    assert_eq!(s.auth.approver_role(), "release-manager");
    assert!(identity.has_role(s.auth.approver_role()));

    let default_names = s.issuer.token("alice", "acme", &["approver"]);
    assert_eq!(
        rejection(&s.auth, &default_names).await,
        "missing tenant claim"
    );
}

#[tokio::test]
async fn unknown_kid_is_rejected() {
    let s = setup(Alg::Es256).await;
    let stranger = TokenIssuer::new(Alg::Es256);
    let token = stranger.token("alice", "acme", &[]);
    assert_eq!(rejection(&s.auth, &token).await, "unknown signing key");

    // A set of several keys: each token finds its own by kid.
    let other = TokenIssuer::new(Alg::Es256);
    let (_dir, two) = with_jwks(json!({ "keys": [s.issuer.jwk(), other.jwk()] })).await;
    assert!(two.verify(&s.issuer.token("a", "t", &[])).await.is_ok());
    assert!(two.verify(&other.token("a", "t", &[])).await.is_ok());
    assert_eq!(rejection(&two, &token).await, "unknown signing key");
}

#[tokio::test]
async fn a_key_verifies_only_its_own_algorithm() {
    // An RS256 token whose kid names an ES256 key.
    let rsa = TokenIssuer::new(Alg::Rs256);
    let ec = TokenIssuer::new(Alg::Es256);
    let mut ec_jwk = ec.jwk();
    ec_jwk["kid"] = json!(rsa.kid());
    let (_dir, auth) = with_jwks(json!({ "keys": [ec_jwk] })).await;
    let token = rsa.token("alice", "acme", &[]);
    assert_eq!(
        rejection(&auth, &token).await,
        "algorithm not allowed for this key"
    );
    // And an RS256 token against an ES256 set under its own kid: no such key.
    let (_dir, auth) = with_jwks(json!({ "keys": [ec.jwk()] })).await;
    assert_eq!(rejection(&auth, &token).await, "unknown signing key");
}

#[tokio::test]
async fn rsa_public_key_as_hmac_secret_is_rejected() {
    let rsa = TokenIssuer::new(Alg::Rs256);
    let jwk = rsa.jwk();
    let (_dir, auth) = with_jwks(json!({ "keys": [jwk.clone()] })).await;
    assert!(auth.verify(&rsa.token("alice", "acme", &[])).await.is_ok());

    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some(rsa.kid().to_owned());
    let public_material = [
        jwk["n"].as_str().unwrap().to_owned(),
        jwk.to_string(),
        rsa.jwks_json(),
    ];
    for secret in public_material {
        let token = jsonwebtoken::encode(
            &header,
            &claims(json!({})),
            &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap();
        assert_eq!(
            rejection(&auth, &token).await,
            "algorithm not allowed for this key"
        );
    }
}

#[tokio::test]
async fn oversize_tokens_are_rejected_before_parsing() {
    let s = setup(Alg::EdDsa).await;
    let padding = "p".repeat(MAX_TOKEN_BYTES);
    let big = s.issuer.token_with(claims(json!({ "padding": padding })));
    assert!(big.len() > MAX_TOKEN_BYTES);
    assert_eq!(rejection(&s.auth, &big).await, "token too large");
    assert_eq!(
        s.auth.authenticate(&bearer(&format!("Bearer {big}"))).await,
        Err(AuthError::Rejected("token too large"))
    );
    let junk = "x".repeat(MAX_TOKEN_BYTES + 1);
    assert_eq!(rejection(&s.auth, &junk).await, "token too large");
    // Just under the limit is parsed (and here verifies).
    let fits = s
        .issuer
        .token_with(claims(json!({ "padding": "p".repeat(5000) })));
    assert!(fits.len() <= MAX_TOKEN_BYTES);
    assert!(s.auth.verify(&fits).await.is_ok());
}

#[tokio::test]
async fn statuses_never_echo_the_token() {
    let s = setup(Alg::Hs256).await;
    let now = now_s();
    let expired = s
        .issuer
        .token_with(claims(json!({"exp": now - 600, "sub": "secret-actor"})));
    let tampered = format!("{expired}x");
    for token in [expired, tampered, "Zm9v.YmFy.YmF6".to_owned()] {
        let error = s
            .auth
            .authenticate(&bearer(&format!("Bearer {token}")))
            .await
            .unwrap_err();
        let status = tonic::Status::from(error);
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        for part in token.split('.') {
            assert!(!status.message().contains(part), "{}", status.message());
        }
        assert!(!status.message().contains("secret-actor"));
    }
    let status = tonic::Status::from(AuthError::Missing);
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert_eq!(status.metadata().get("www-authenticate").unwrap(), "Bearer");
}

fn jwt_config() -> AuthConfig {
    AuthConfig {
        mode: AuthMode::Jwt,
        jwks_url: Some("https://id.example/.well-known/jwks.json".into()),
        issuer: Some("https://id.example".into()),
        audience: Some("agentloop".into()),
        ..AuthConfig::default()
    }
}

#[test]
fn validate_names_the_key() {
    assert_eq!(jwt_config().validate(), Ok(()));
    type Change = Box<dyn Fn(&mut AuthConfig)>;
    let cases: Vec<(Change, &str)> = vec![
        (
            Box::new(|c| c.issuer = None),
            "auth.issuer is required with auth.mode = \"jwt\"",
        ),
        (
            Box::new(|c| c.issuer = Some(" ".into())),
            "auth.issuer is required with auth.mode = \"jwt\"",
        ),
        (
            Box::new(|c| c.audience = None),
            "auth.audience is required with auth.mode = \"jwt\"",
        ),
        (
            Box::new(|c| c.jwks_url = None),
            "auth.mode = \"jwt\" needs exactly one of auth.hs256_secret_file, auth.jwks_file, auth.jwks_url (0 set)",
        ),
        (
            Box::new(|c| c.jwks_file = Some("/etc/jwks.json".into())),
            "auth.mode = \"jwt\" needs exactly one of auth.hs256_secret_file, auth.jwks_file, auth.jwks_url (2 set)",
        ),
        (
            Box::new(|c| c.leeway_s = 301),
            "auth.leeway_s must be at most 300 (got 301)",
        ),
        (
            Box::new(|c| c.jwks_refresh_s = 9),
            "auth.jwks_refresh_s must be at least 10 (got 9)",
        ),
        (
            Box::new(|c| c.tenant_claim = String::new()),
            "auth.tenant_claim must not be empty",
        ),
        (
            Box::new(|c| c.roles_claim = String::new()),
            "auth.roles_claim must not be empty",
        ),
        (
            Box::new(|c| c.approver_role = String::new()),
            "auth.approver_role must not be empty",
        ),
        (
            Box::new(|c| c.jwks_url = Some("file:///etc/jwks.json".into())),
            "auth.jwks_url must be an http:// or https:// URL",
        ),
        (
            Box::new(|c| c.jwks_url = Some("ftp://id.example/jwks".into())),
            "auth.jwks_url must be an http:// or https:// URL",
        ),
        (
            Box::new(|c| {
                c.jwks_url = None;
                c.hs256_secret_file = Some("".into());
            }),
            "auth.hs256_secret_file must not be empty",
        ),
    ];
    for (change, expected) in cases {
        let mut config = jwt_config();
        change(&mut config);
        assert_eq!(config.validate(), Err(expected.to_owned()));
    }
    let error = AuthConfig {
        jwks_url: Some("not a url".into()),
        ..jwt_config()
    }
    .validate()
    .unwrap_err();
    assert!(error.starts_with("auth.jwks_url is not a URL"), "{error}");

    // Mode none: key settings are allowed and unchecked.
    let off = AuthConfig {
        mode: AuthMode::None,
        leeway_s: 10_000,
        issuer: None,
        ..jwt_config()
    };
    assert_eq!(off.validate(), Ok(()));
    assert!(!off.is_on());
    assert!(jwt_config().is_on());
}

#[tokio::test]
async fn from_config_refuses_unusable_key_sources() {
    assert!(
        Authenticator::from_config(&AuthConfig::default())
            .await
            .unwrap()
            .is_none()
    );

    let invalid = Authenticator::from_config(&AuthConfig {
        issuer: None,
        ..jwt_config()
    })
    .await
    .unwrap_err();
    assert!(matches!(invalid, AuthConfigError::Invalid(_)), "{invalid}");

    let dir = tempfile::tempdir().unwrap();
    let source = |hs256: Option<&str>, jwks: Option<&str>| AuthConfig {
        jwks_url: None,
        hs256_secret_file: hs256.map(|name| dir.path().join(name)),
        jwks_file: jwks.map(|name| dir.path().join(name)),
        ..jwt_config()
    };

    let missing = Authenticator::from_config(&source(Some("absent"), None))
        .await
        .unwrap_err();
    assert!(
        matches!(
            missing,
            AuthConfigError::File {
                problem: FileProblem::Unreadable(_),
                ..
            }
        ),
        "{missing}"
    );
    let message = missing.to_string();
    assert!(message.starts_with("auth.hs256_secret_file "), "{message}");
    assert!(message.contains(&dir.path().join("absent").display().to_string()));

    std::fs::write(
        dir.path().join("short"),
        "s3cr3t-but-only-31-bytes-long!!\n",
    )
    .unwrap();
    let short = Authenticator::from_config(&source(Some("short"), None))
        .await
        .unwrap_err();
    assert!(
        matches!(
            short,
            AuthConfigError::File {
                problem: FileProblem::TooShort(32),
                ..
            }
        ),
        "{short}"
    );
    assert!(!short.to_string().contains("s3cr3t"), "{short}");
    std::fs::write(
        dir.path().join("long"),
        "s3cr3t-and-exactly-32-bytes-long\n",
    )
    .unwrap();
    assert!(
        Authenticator::from_config(&source(Some("long"), None))
            .await
            .is_ok()
    );

    std::fs::write(dir.path().join("empty.json"), r#"{"keys": []}"#).unwrap();
    let empty = Authenticator::from_config(&source(None, Some("empty.json")))
        .await
        .unwrap_err();
    let message = empty.to_string();
    assert!(matches!(
        empty,
        AuthConfigError::Jwks {
            key: "auth.jwks_file",
            ..
        }
    ));
    assert!(message.contains("no usable key"), "{message}");
    assert!(message.contains("empty.json"), "{message}");

    std::fs::write(dir.path().join("text.json"), "hello").unwrap();
    let text = Authenticator::from_config(&source(None, Some("text.json")))
        .await
        .unwrap_err();
    assert!(text.to_string().contains("not a JWK set"), "{text}");

    let missing = Authenticator::from_config(&source(None, Some("nope.json")))
        .await
        .unwrap_err();
    assert!(
        missing.to_string().starts_with("auth.jwks_file "),
        "{missing}"
    );
}

/// The development minter (`mint_hs256`) makes tokens this verifier accepts.
#[tokio::test]
async fn dev_tokens_verify() {
    let s = setup(Alg::Hs256).await;
    let secret = hs256_secret(&s.issuer);
    let dev = agentloop_auth::DevToken {
        issuer: ISSUER.into(),
        audience: AUDIENCE.into(),
        actor: "alice".into(),
        tenant: "acme".into(),
        roles: vec!["approver".into()],
        valid_for_s: 60,
    };
    let token = agentloop_auth::mint_hs256(&secret, &dev).unwrap();
    let identity = s.auth.verify(&token).await.unwrap();
    assert_eq!(identity.actor, "alice");
    assert_eq!(identity.tenant, "acme");
    assert!(identity.has_role("approver"));
}

/// The secret an HS256 issuer signs with, as its secret file holds it.
fn hs256_secret(issuer: &TokenIssuer) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = issuer
        .write_key_source(dir.path())
        .hs256_secret_file
        .unwrap();
    agentloop_auth::read_secret_file(&file).unwrap()
}
