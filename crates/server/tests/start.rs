//! The shared start through its library entry, `Service::prepare`: the same steps as
//! `Service::start` minus the exits, with the environment passed in. The exits
//! themselves (78, 0) are tested against a real binary in `services/ledger/tests`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::io::Write;
use std::path::Path;

use agentloop_server::config::{ConfigError, load_from};
use agentloop_server::{
    CommonFlags, Prepared, ServerSettings, Service, ServiceConfig, StartError, Started, UnknownKeys,
};
use serde::{Deserialize, Serialize};

const SERVICE: Service = Service::new("agentloop-test");

/// A service configuration shaped like the real ones: the shared settings, a URL that
/// may hold a password, a nested table, and unknown keys refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
struct TestConfig {
    #[serde(flatten)]
    server: ServerSettings,
    database_url: Option<String>,
    retries: u32,
    store: Store,
    #[serde(flatten)]
    unknown: UnknownKeys,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Store {
    path: String,
    endpoints: Vec<String>,
}

impl Default for TestConfig {
    fn default() -> Self {
        Self {
            server: ServerSettings::default(),
            database_url: None,
            retries: 1,
            store: Store::default(),
            unknown: UnknownKeys,
        }
    }
}

impl Default for Store {
    fn default() -> Self {
        Self {
            path: "default.db".into(),
            endpoints: vec!["http://127.0.0.1:1".into()],
        }
    }
}

impl ServiceConfig for TestConfig {
    type Auth = agentloop_auth::CallersConfig;

    fn server(&self) -> &ServerSettings {
        &self.server
    }
}

/// A main's flags: the common ones flattened, plus one of its own.
#[derive(Debug, Default, Serialize)]
struct Flags {
    #[serde(flatten)]
    common: CommonFlags,
    retries: Option<u32>,
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn toml_file(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    path
}

fn accept_all(_: &TestConfig) -> Result<(), Infallible> {
    Ok(())
}

async fn prepare(
    flags: &Flags,
    env: Vec<(String, String)>,
) -> Result<Prepared<TestConfig, ()>, StartError> {
    SERVICE.prepare(&flags.common, flags, env, accept_all).await
}

fn serving<C, V>(prepared: Prepared<C, V>) -> Started<C, V> {
    match prepared {
        Prepared::Serve(started) => started,
        Prepared::Dump(text) => panic!("dumped instead of serving:\n{text}"),
    }
}

fn dumped<C, V>(prepared: Prepared<C, V>) -> String {
    match prepared {
        Prepared::Dump(text) => text,
        Prepared::Serve(started) => panic!("served on {:?}", started.listener.local_addr()),
    }
}

#[test]
fn names_are_derived_from_the_binary_name() {
    let service = Service::new("agentloop-demo-executor");
    assert_eq!(service.name(), "agentloop-demo-executor");
    assert_eq!(service.env_prefix(), "AGENTLOOP_DEMO_EXECUTOR_");
    assert_eq!(service.config_env(), "AGENTLOOP_DEMO_EXECUTOR_CONFIG");
}

#[tokio::test]
async fn binds_the_configured_address_and_hands_back_what_validation_built() {
    let flags = Flags::default();
    let started = serving(
        SERVICE
            .prepare(&flags.common, &flags, env(&[]), |config: &TestConfig| {
                Ok::<_, Infallible>(config.retries * 10)
            })
            .await
            .unwrap(),
    );
    assert_eq!(started.validated, 10);
    assert_eq!(started.config, TestConfig::default());
    assert_ne!(started.listener.local_addr().unwrap().port(), 0);
}

#[tokio::test]
async fn a_taken_port_is_a_listen_error_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let flags = Flags {
        common: CommonFlags {
            listen: Some(address),
            ..CommonFlags::default()
        },
        ..Flags::default()
    };
    let error = prepare(&flags, env(&[])).await.unwrap_err();
    assert!(
        matches!(&error, StartError::Listen { address: a, .. } if *a == address),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.starts_with(&format!("cannot listen on {address}: ")),
        "{message}"
    );
}

#[tokio::test]
async fn a_listen_address_that_is_not_ip_and_port_fails_at_load() {
    let error = prepare(
        &Flags::default(),
        env(&[("AGENTLOOP_TEST_LISTEN", "localhost:1")]),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&error, StartError::Config(ConfigError::Invalid { key, .. }) if key == "listen"),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_shared_setting_in_the_file_is_read_and_a_bad_one_named_with_its_source() {
    let dir = tempfile::tempdir().unwrap();
    let file = toml_file(
        dir.path(),
        "service.toml",
        "metrics_listen = \"127.0.0.1:0\"\nretries = 2\n[telemetry]\nlog_format = \"json\"\n",
    );
    let flags = Flags {
        common: CommonFlags {
            config: Some(file),
            ..CommonFlags::default()
        },
        ..Flags::default()
    };
    let started = match prepare(&flags, env(&[])).await.unwrap() {
        Prepared::Serve(started) => started,
        Prepared::Dump(_) => panic!("not a dump"),
    };
    assert_eq!(started.config.retries, 2);
    assert!(started.metrics_listener.is_some());
    assert!(started.config.server.telemetry.log_format.is_some());

    let error = prepare(
        &Flags::default(),
        env(&[("AGENTLOOP_TEST_METRICS_LISTEN", "nowhere")]),
    )
    .await
    .unwrap_err();
    let StartError::Config(ConfigError::Invalid { key, message }) = &error else {
        panic!("{error:?}");
    };
    assert_eq!(key, "metrics_listen");
    assert!(
        message.contains("AGENTLOOP_TEST_METRICS_LISTEN"),
        "{message}"
    );
}

#[tokio::test]
async fn a_key_no_setting_has_is_refused_by_name() {
    for (variable, key) in [
        ("AGENTLOOP_TEST_LISTEN_ADDRESS", "listen_address"),
        ("AGENTLOOP_TEST_RETRY", "retry"),
    ] {
        let error = prepare(&Flags::default(), env(&[(variable, "1")]))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, StartError::Config(ConfigError::Invalid { key: named, .. }) if named == key),
            "{error:?}"
        );
        assert_eq!(
            error.to_string(),
            format!("invalid configuration key `{key}`: unknown key")
        );
    }
    // Within a table of the shared settings, serde's own refusal, with its path.
    let error = prepare(
        &Flags::default(),
        env(&[("AGENTLOOP_TEST_TELEMETRY__BOGUS", "1")]),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&error, StartError::Config(ConfigError::Invalid { key, .. }) if key == "telemetry.bogus"),
        "{error:?}"
    );
}

#[tokio::test]
async fn the_dump_loads_back_to_the_effective_config_with_the_password_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let file = toml_file(
        dir.path(),
        "service.toml",
        "retries = 2\n[store]\nendpoints = [\"https://proxy:pr0xy@tools:443\"]\n",
    );
    let environment = env(&[
        (
            "AGENTLOOP_TEST_DATABASE_URL",
            "postgres://ledger:s3cret@db.internal:6543/effects",
        ),
        ("AGENTLOOP_TEST_STORE__PATH", "env.db"),
    ]);
    // The port is taken: a dump must not bind.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let flags = Flags {
        common: CommonFlags {
            config: Some(file.clone()),
            listen: Some(taken.local_addr().unwrap()),
            dump_config: true,
            insecure_no_auth: false,
        },
        retries: Some(5),
    };
    let dump = dumped(prepare(&flags, environment.clone()).await.unwrap());

    assert!(dump.starts_with("# agentloop-test: "), "{dump}");
    for secret in ["s3cret", "pr0xy"] {
        assert!(!dump.contains(secret), "{dump}");
    }
    let effective: TestConfig =
        load_from(Some(&file), environment, &SERVICE.env_prefix(), &flags).unwrap();
    assert_eq!(effective.retries, 5, "the flag beats the file");
    let redacted = TestConfig {
        database_url: Some("postgres://ledger:REDACTED@db.internal:6543/effects".into()),
        store: Store {
            endpoints: vec!["https://proxy:REDACTED@tools:443".into()],
            ..effective.store.clone()
        },
        ..effective.clone()
    };

    // Fed back as the configuration file, with nothing else, the dump is the config.
    let dumped_file = toml_file(dir.path(), "dumped.toml", &dump);
    let reloaded: TestConfig = load_from(
        Some(&dumped_file),
        env(&[]),
        "AGENTLOOP_TEST_",
        Flags::default(),
    )
    .unwrap();
    assert_eq!(reloaded, redacted);
}

#[tokio::test]
async fn validation_runs_before_the_dump() {
    let flags = Flags {
        common: CommonFlags {
            dump_config: true,
            ..CommonFlags::default()
        },
        retries: Some(9),
    };
    let error = SERVICE
        .prepare(&flags.common, &flags, env(&[]), |config: &TestConfig| {
            if config.retries > 3 {
                return Err(format!("retries must be at most 3, not {}", config.retries));
            }
            Ok(())
        })
        .await
        .unwrap_err();
    assert!(matches!(error, StartError::Invalid(_)), "{error:?}");
    assert_eq!(error.to_string(), "retries must be at most 3, not 9");
}

#[tokio::test]
async fn the_config_variable_names_the_file_and_the_flag_beats_it() {
    let dir = tempfile::tempdir().unwrap();
    let from_env = toml_file(dir.path(), "env.toml", "retries = 7\n");
    let from_flag = toml_file(dir.path(), "flag.toml", "retries = 9\n");
    let variable = [("AGENTLOOP_TEST_CONFIG", from_env.to_str().unwrap())];

    // Read for --config, and not mistaken for a configuration key `config`.
    let started = serving(prepare(&Flags::default(), env(&variable)).await.unwrap());
    assert_eq!(started.config.retries, 7);

    let flags = Flags {
        common: CommonFlags {
            config: Some(from_flag),
            ..CommonFlags::default()
        },
        ..Flags::default()
    };
    let started = serving(prepare(&flags, env(&variable)).await.unwrap());
    assert_eq!(started.config.retries, 9);

    let empty = [("AGENTLOOP_TEST_CONFIG", "")];
    let started = serving(prepare(&Flags::default(), env(&empty)).await.unwrap());
    assert_eq!(started.config, TestConfig::default());

    let missing = dir.path().join("missing.toml");
    let error = prepare(
        &Flags::default(),
        env(&[("AGENTLOOP_TEST_CONFIG", missing.to_str().unwrap())]),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, StartError::Config(ConfigError::MissingFile { .. })),
        "{error:?}"
    );
}
