//! Service tokens of internal callers: the right token names its caller, anything else is
//! UNAUTHENTICATED, and configurations that cannot tell callers apart are refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use agentloop_auth::{
    AuthConfigError, AuthError, Caller, CallerConfig, Callers, CallersConfig, FileProblem,
};
use tonic::metadata::MetadataMap;
use tonic::service::Interceptor;

const ORCHESTRATOR_TOKEN: &str = "orchestrator-token-0123456789abcdefghij";
const GATEWAY_TOKEN: &str = "gateway-token-0123456789abcdefghijklmnop";

fn two_callers() -> Callers {
    Callers::from_tokens([
        ("orchestrator".to_owned(), ORCHESTRATOR_TOKEN.to_owned()),
        ("tools-gateway".to_owned(), GATEWAY_TOKEN.to_owned()),
    ])
    .unwrap()
}

fn bearer(value: &str) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    metadata.insert("authorization", value.parse().unwrap());
    metadata
}

#[test]
fn each_token_names_its_caller() {
    let callers = two_callers();
    assert_eq!(
        callers.authenticate(&bearer(&format!("Bearer {ORCHESTRATOR_TOKEN}"))),
        Ok("orchestrator".to_owned())
    );
    assert_eq!(
        callers.authenticate(&bearer(&format!("Bearer {GATEWAY_TOKEN}"))),
        Ok("tools-gateway".to_owned())
    );
}

#[test]
fn anything_else_is_refused() {
    let callers = two_callers();
    assert_eq!(
        callers.authenticate(&MetadataMap::new()),
        Err(AuthError::Missing)
    );
    assert_eq!(
        callers.authenticate(&bearer(ORCHESTRATOR_TOKEN)),
        Err(AuthError::Malformed)
    );
    assert_eq!(
        callers.authenticate(&bearer(&format!("Basic {ORCHESTRATOR_TOKEN}"))),
        Err(AuthError::Malformed)
    );
    let almost = &ORCHESTRATOR_TOKEN[..ORCHESTRATOR_TOKEN.len() - 1];
    for wrong in [
        almost,
        "x",
        &format!("{ORCHESTRATOR_TOKEN}x"),
        &ORCHESTRATOR_TOKEN.to_uppercase(),
    ] {
        assert_eq!(
            callers.authenticate(&bearer(&format!("Bearer {wrong}"))),
            Err(AuthError::Rejected("unknown service token")),
            "{wrong}"
        );
    }
}

#[test]
fn interceptor_puts_the_caller_in_the_extensions() {
    let mut interceptor = two_callers().interceptor();

    let mut request = tonic::Request::new(());
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {GATEWAY_TOKEN}").parse().unwrap(),
    );
    let request = interceptor.call(request).unwrap();
    assert_eq!(
        request.extensions().get::<Caller>(),
        Some(&Caller("tools-gateway".to_owned()))
    );

    let status = interceptor.call(tonic::Request::new(())).unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert_eq!(status.metadata().get("www-authenticate").unwrap(), "Bearer");

    let wrong = "wrong-token-0123456789abcdefghijklmnopqrstuvwxyz";
    let mut request = tonic::Request::new(());
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {wrong}").parse().unwrap());
    let status = interceptor.clone().call(request).unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert!(!status.message().contains(wrong), "{}", status.message());
}

#[test]
fn from_tokens_refuses_callers_that_cannot_be_told_apart() {
    let same_token = Callers::from_tokens([
        ("orchestrator".to_owned(), ORCHESTRATOR_TOKEN.to_owned()),
        ("tools-gateway".to_owned(), ORCHESTRATOR_TOKEN.to_owned()),
    ])
    .unwrap_err();
    assert!(matches!(same_token, AuthConfigError::Callers(_)));
    let message = same_token.to_string();
    assert!(message.contains("same token"), "{message}");
    assert!(!message.contains(ORCHESTRATOR_TOKEN), "{message}");

    let same_name = Callers::from_tokens([
        ("orchestrator".to_owned(), ORCHESTRATOR_TOKEN.to_owned()),
        ("orchestrator".to_owned(), GATEWAY_TOKEN.to_owned()),
    ])
    .unwrap_err();
    assert!(
        same_name.to_string().contains("more than once"),
        "{same_name}"
    );

    let short = Callers::from_tokens([("orchestrator".to_owned(), "short".to_owned())]);
    assert!(
        short
            .unwrap_err()
            .to_string()
            .contains("shorter than 32 bytes")
    );
    let bad_name = Callers::from_tokens([("orc hestrator".to_owned(), GATEWAY_TOKEN.to_owned())]);
    assert!(bad_name.is_err());
    assert!(Callers::from_tokens(Vec::new()).is_err());
}

#[test]
fn from_config_reads_token_files() {
    assert!(
        Callers::from_config(&CallersConfig::default())
            .unwrap()
            .is_none()
    );
    assert!(!CallersConfig::default().is_on());

    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, content: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path
    };
    let config = CallersConfig {
        callers: vec![
            CallerConfig {
                name: "orchestrator".into(),
                token_file: Some(file(
                    "orchestrator.token",
                    &format!("{ORCHESTRATOR_TOKEN}\n"),
                )),
                spiffe_id: None,
            },
            CallerConfig {
                name: "tools-gateway".into(),
                token_file: Some(file("gateway.token", &format!("  {GATEWAY_TOKEN}  \n"))),
                spiffe_id: None,
            },
        ],
    };
    assert!(config.is_on());
    let callers = Callers::from_config(&config).unwrap().unwrap();
    assert_eq!(
        callers.authenticate(&bearer(&format!("Bearer {GATEWAY_TOKEN}"))),
        Ok("tools-gateway".to_owned())
    );

    let mut duplicate = config.clone();
    duplicate.callers[1].token_file = Some(file("copy.token", ORCHESTRATOR_TOKEN));
    let error = Callers::from_config(&duplicate).unwrap_err();
    assert!(error.to_string().contains("same token"), "{error}");

    let mut short = config.clone();
    short.callers[1].token_file = Some(file("short.token", "0123456789"));
    let error = Callers::from_config(&short).unwrap_err();
    assert!(
        matches!(
            error,
            AuthConfigError::File {
                problem: FileProblem::TooShort(32),
                ..
            }
        ),
        "{error}"
    );
    let message = error.to_string();
    assert!(message.starts_with("callers[1].token_file "), "{message}");
    assert!(message.contains("short.token"), "{message}");
    assert!(!message.contains("0123456789"), "{message}");

    let mut missing = config.clone();
    missing.callers[0].token_file = Some(dir.path().join("absent.token"));
    let error = Callers::from_config(&missing).unwrap_err();
    assert!(
        error.to_string().starts_with("callers[0].token_file "),
        "{error}"
    );
    assert!(error.to_string().contains("absent.token"), "{error}");
}

#[test]
fn validate_names_the_entry() {
    let caller = |name: &str, file: &str| CallerConfig {
        name: name.into(),
        token_file: Some(file.into()),
        spiffe_id: None,
    };
    let by_id = |name: &str, id: &str| CallerConfig {
        name: name.into(),
        token_file: None,
        spiffe_id: Some(id.into()),
    };
    let ok = CallersConfig {
        callers: vec![
            caller("orchestrator", "/run/a"),
            caller("gateway", "/run/b"),
        ],
    };
    assert_eq!(ok.validate(), Ok(()));
    let cases = [
        (
            vec![caller("a", "/x"), caller("a", "/y")],
            "callers[1].name \"a\" is listed more than once",
        ),
        (
            vec![caller("", "/x")],
            "callers[0].name must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ / + = -",
        ),
        (
            vec![caller("a", "")],
            "callers[0].token_file must not be empty",
        ),
        (
            vec![CallerConfig {
                name: "a".into(),
                token_file: None,
                spiffe_id: None,
            }],
            "callers[0] needs a token_file or a spiffe_id",
        ),
        (
            vec![by_id("a", "not a uri")],
            "callers[0].spiffe_id must be a URI such as spiffe://domain/path",
        ),
        (
            vec![
                by_id("a", "spiffe://t/orchestrator"),
                by_id("b", "spiffe://t/orchestrator"),
            ],
            "callers[1].spiffe_id \"spiffe://t/orchestrator\" is listed more than once",
        ),
    ];
    for (callers, expected) in cases {
        let config = CallersConfig { callers };
        assert_eq!(config.validate(), Err(expected.to_owned()));
        let error = Callers::from_config(&config).unwrap_err();
        assert!(matches!(error, AuthConfigError::Invalid(_)), "{error}");
    }

    let parsed: CallersConfig = serde_json::from_str(
        r#"{"callers":[{"name":"orchestrator","token_file":"/run/secrets/orchestrator"}]}"#,
    )
    .unwrap();
    assert_eq!(parsed.callers[0].name, "orchestrator");
    // A caller with neither credential parses, and validation names what is missing.
    let bare: CallersConfig = serde_json::from_str(r#"{"callers":[{"name":"a"}]}"#).unwrap();
    assert_eq!(
        bare.validate(),
        Err("callers[0] needs a token_file or a spiffe_id".to_owned())
    );
    assert!(
        serde_json::from_str::<CallersConfig>(
            r#"{"callers":[{"name":"a","token_file":"/x","token":"inline"}]}"#
        )
        .is_err()
    );
}
