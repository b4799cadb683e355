//! Layering of `config::load_from`: defaults < file < environment < overrides.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;

use agentloop_server::config::{ConfigError, load_from};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Settings {
    listen: String,
    name: String,
    retries: u32,
    store: Store,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Store {
    busy_timeout_ms: u64,
    path: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:1".into(),
            name: "default-name".into(),
            retries: 1,
            store: Store::default(),
        }
    }
}

impl Default for Store {
    fn default() -> Self {
        Self {
            busy_timeout_ms: 100,
            path: "default.db".into(),
        }
    }
}

/// Flags as a main has them: every field optional, a flag not given `None`, at any
/// depth.
#[derive(Debug, Default, Serialize)]
struct Flags {
    listen: Option<String>,
    retries: Option<u32>,
    store: StoreFlags,
}

#[derive(Debug, Default, Serialize)]
struct StoreFlags {
    path: Option<String>,
}

fn toml_file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn defaults_only() {
    let s: Settings = load_from(None, env(&[]), "APP_", Flags::default()).unwrap();
    assert_eq!(s, Settings::default());
}

#[test]
fn each_layer_overrides_the_one_before_and_none_does_not_clobber() {
    let file = toml_file(
        "listen = \"file:1\"\nname = \"file-name\"\nretries = 2\n[store]\npath = \"file.db\"\n",
    );
    let s: Settings = load_from(
        Some(file.path()),
        env(&[
            ("APP_RETRIES", "3"),
            ("APP_STORE__BUSY_TIMEOUT_MS", "5000"),
            ("app_listen", "env:1"), // prefix matched case-insensitively
            ("OTHER_NAME", "ignored"),
        ]),
        "APP_",
        Flags {
            listen: Some("flag:1".into()),
            retries: None,
            store: StoreFlags { path: None },
        },
    )
    .unwrap();
    assert_eq!(
        s,
        Settings {
            listen: "flag:1".into(),  // override beats env and file
            name: "file-name".into(), // file beats default; env has none
            retries: 3,               // env beats file; the None flag does not clobber
            store: Store {
                busy_timeout_ms: 5000,  // nested via `__`
                path: "file.db".into(), // nested table from the file; its None flag neither
            },
        }
    );
}

#[test]
fn bad_env_value_names_the_key() {
    let err = load_from::<Settings>(
        None,
        env(&[("APP_STORE__BUSY_TIMEOUT_MS", "soon")]),
        "APP_",
        Flags::default(),
    )
    .unwrap_err();
    match &err {
        ConfigError::Invalid { key, .. } => assert_eq!(key, "store.busy_timeout_ms"),
        other => panic!("unexpected {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains("store.busy_timeout_ms"), "{message}");
    assert!(message.contains("APP_STORE__BUSY_TIMEOUT_MS"), "{message}");
}

#[test]
fn bad_file_value_and_unknown_key_name_the_key() {
    let file = toml_file("retries = \"many\"\n");
    let err =
        load_from::<Settings>(Some(file.path()), env(&[]), "APP_", Flags::default()).unwrap_err();
    assert!(err.to_string().contains("`retries`"), "{err}");

    let file = toml_file("[store]\nbusy_timeout = 1\n");
    let err =
        load_from::<Settings>(Some(file.path()), env(&[]), "APP_", Flags::default()).unwrap_err();
    assert!(err.to_string().contains("busy_timeout"), "{err}");
}

#[test]
fn a_named_file_that_does_not_exist_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let err =
        load_from::<Settings>(Some(&missing), env(&[]), "APP_", Flags::default()).unwrap_err();
    assert!(matches!(err, ConfigError::MissingFile { .. }), "{err:?}");
}

#[test]
fn the_variable_that_names_the_file_is_not_a_key() {
    // `deny_unknown_fields` would refuse a key `config`.
    let s: Settings = load_from(
        None,
        env(&[("APP_CONFIG", "/somewhere/else.toml"), ("APP_RETRIES", "4")]),
        "APP_",
        Flags::default(),
    )
    .unwrap();
    assert_eq!(s.retries, 4);
}
