//! The `agentloop-ledger` binary's common flags (`agentloop_server::Service::start`) as
//! an operator meets them: exit codes, stderr, and `--dump-config` on stdout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};

use agentloop_ledger::{ENV_PREFIX, LedgerConfig};
use agentloop_server::Service;

/// The binary with an empty environment (a developer's `AGENTLOOP_LEDGER_*` must not
/// leak in) plus `env`.
fn ledger(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agentloop-ledger"))
        .env_clear()
        .envs(env.iter().copied())
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_service_reads_the_ledger_prefix() {
    assert_eq!(Service::new("agentloop-ledger").env_prefix(), ENV_PREFIX);
}

#[test]
fn a_taken_port_exits_78_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let data = tempfile::tempdir().unwrap();
    let output = ledger(
        &[
            "--listen",
            &address,
            "--data-dir",
            data.path().to_str().unwrap(),
        ],
        &[],
    );
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "agentloop-ledger: bad configuration: cannot listen on {address}: "
        )),
        "{stderr}"
    );
}

#[test]
fn dump_config_prints_the_layered_config_without_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ledger.toml");
    std::fs::write(&file, "max_connections = 16\nbusy_timeout_ms = 100\n").unwrap();
    let output = ledger(
        &["--listen", "127.0.0.1:1", "--dump-config"],
        &[
            // The file comes from the variable, not from --config.
            ("AGENTLOOP_LEDGER_CONFIG", file.to_str().unwrap()),
            (
                "AGENTLOOP_LEDGER_DATABASE_URL",
                "postgres://ledger:s3cret@db.internal:6543/effects",
            ),
            ("AGENTLOOP_LEDGER_BUSY_TIMEOUT_MS", "250"),
        ],
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!stdout.contains("s3cret"), "{stdout}");

    // stdout is the TOML alone: loaded back as the only layer, it is the config.
    let dumped = dir.path().join("dumped.toml");
    std::fs::write(&dumped, &stdout).unwrap();
    #[derive(serde::Serialize)]
    struct NoFlags {}
    let reloaded: LedgerConfig =
        agentloop_server::config::load_from(Some(&dumped), Vec::new(), ENV_PREFIX, NoFlags {})
            .unwrap();
    assert_eq!(
        reloaded,
        LedgerConfig {
            server: agentloop_server::ServerSettings::on_port(1),
            database_url: Some("postgres://ledger:REDACTED@db.internal:6543/effects".into()),
            max_connections: 16,
            busy_timeout_ms: 250,
            ..LedgerConfig::default()
        }
    );
}

#[test]
fn an_invalid_config_is_not_dumped() {
    let output = ledger(
        &["--dump-config"],
        &[("AGENTLOOP_LEDGER_MAX_CONNECTIONS", "0")],
    );
    assert_eq!(output.status.code(), Some(78));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("max_connections must be at least 1"),
        "{stderr}"
    );
}
