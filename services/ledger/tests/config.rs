//! The `agentloop-ledger` binary's configuration: the backend it picks and the fixed exit
//! code for a bad one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use agentloop_ledger::{ENV_PREFIX, LedgerConfig};

#[test]
fn a_database_url_that_is_not_postgres_exits_78() {
    let output = Command::new(env!("CARGO_BIN_EXE_agentloop-ledger"))
        .args(["--database-url", "mysql://root@localhost/ledger"])
        .env_remove("AGENTLOOP_LEDGER_DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(78));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("database_url must be a postgres://"),
        "{stderr}"
    );
}

#[test]
fn a_config_file_selects_postgres_and_logs_no_password() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.toml");
    std::fs::write(
        &path,
        "database_url = \"postgres://ledger:s3cret@db.internal:6543/effects\"\nmax_connections = 16\n",
    )
    .unwrap();
    #[derive(serde::Serialize)]
    struct NoFlags {}
    let config: LedgerConfig =
        agentloop_server::config::load(Some(&path), ENV_PREFIX, &NoFlags {}).unwrap();
    config.validate().unwrap();
    assert_eq!(config.max_connections, 16);
    let described = config.describe_backend();
    assert_eq!(described, "postgres db.internal:6543/effects");
    assert!(!described.contains("s3cret"));

    let default = LedgerConfig::default();
    default.validate().unwrap();
    assert!(
        default.describe_backend().starts_with("sqlite "),
        "{}",
        default.describe_backend()
    );
    for bad in ["sqlite://x.db", "postgres://host:notaport/db"] {
        let config = LedgerConfig {
            database_url: Some(bad.into()),
            ..LedgerConfig::default()
        };
        assert!(config.validate().is_err(), "{bad}");
    }
    let zero = LedgerConfig {
        max_connections: 0,
        ..LedgerConfig::default()
    };
    assert!(zero.validate().is_err());
}
