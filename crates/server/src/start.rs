//! The start every service binary shares: the common flags, the layered configuration,
//! validation, `--dump-config`, and bind-or-exit.
//!
//! Written once because the six mains drifted apart when each wrote its own: `listen`
//! was a `String` in some and a `SocketAddr` in others, a port already taken exited 78
//! in some and 1 in others, `--config` had an environment fallback in some only, and
//! the crypto provider and the log were set up in different orders. An operator can
//! now rely on the same flags, the same exit codes and the same messages everywhere.
//!
//! A service `main.rs` is: its own flags, [`Service::parse`] into [`Flags`] (the
//! [`CommonFlags`] and its own), one [`Service::start`], build the service from the
//! config, and `run(listener, …, shutdown_signal())`.

use std::fmt::Display;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;

use crate::config::{self, ConfigError};
use crate::dump;
use crate::settings::{CallerAuth, ClientSettings, ServerSettings};

/// A service binary's command line: the flags every service has, then its own (`S`), each
/// field of which overrides the configuration key of its name when it is given.
#[derive(Debug, Clone, Default, clap::Parser, Serialize)]
pub struct Flags<S: clap::Args> {
    /// The flags every service has.
    #[command(flatten)]
    #[serde(flatten)]
    pub common: CommonFlags,
    /// The service's own.
    #[command(flatten)]
    #[serde(flatten)]
    pub own: S,
}

/// The flags every service binary has ([`Flags::common`]); the service's own flags stay
/// in its main.
///
/// `listen` follows the override convention of [`config::load`] (absent unless given),
/// so it layers over the file and the environment like any other flag; `config` and
/// `dump_config` steer the start itself and are never configuration keys. A `--listen`
/// that is not an IP:port is a usage error like any malformed flag (clap, exit 2); the
/// same value in the file or the environment is a bad configuration (exit 78).
#[derive(Debug, Clone, Default, clap::Args, Serialize)]
pub struct CommonFlags {
    /// TOML configuration file; it must exist.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Address to listen on, as IP:port (0.0.0.0:PORT: every IPv4 interface; [::]:PORT: IPv6).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Print the effective configuration (defaults, file, environment, flags) as TOML
    /// on stdout once it has been validated, then exit 0 without listening. The
    /// password of a URL (`user:password@`, `?password=`) is printed as REDACTED;
    /// API keys are never in the configuration, only the names of their variables.
    #[arg(long)]
    #[serde(skip)]
    pub dump_config: bool,
    /// Listen on a non-loopback address although callers are not authenticated: anyone
    /// who reaches the port may call every RPC. Logged as a warning.
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub insecure_no_auth: bool,
}

/// A service configuration as the shared start needs it: layered by [`config::load`]
/// (so `Default`, serde both ways), printable by `--dump-config`, and with the shared
/// settings flattened in ([`ServerSettings`]; [`crate::UnknownKeys`] last).
pub trait ServiceConfig: Serialize + DeserializeOwned + Default {
    /// How its callers are authenticated (`[auth]`).
    type Auth: CallerAuth + Serialize + DeserializeOwned + Default;

    /// The shared settings: `listen` (typed, so that an address that is not an IP:port
    /// fails at load, exit 78, rather than at bind), `metrics_listen`, `[auth]`,
    /// `insecure_no_auth`, `[telemetry]` and `[server_tls]`.
    fn server(&self) -> &ServerSettings<Self::Auth>;
}

/// What [`Service::start`] hands to the rest of `main`.
#[derive(Debug)]
pub struct Started<C, V> {
    /// The effective configuration, validated.
    pub config: C,
    /// What the service's validation returned, e.g. a server built from `config`, so
    /// `main` does not build it twice.
    pub validated: V,
    /// Bound to `config.listen()`, not yet accepting.
    pub listener: TcpListener,
    /// Bound to `config.metrics_listen()`, if set.
    pub metrics_listener: Option<TcpListener>,
    /// The service's telemetry: its tracer (exporting when configured) and its metrics,
    /// served on `metrics_listen` already. Pass it to the service and its servers.
    pub telemetry: agentloop_telemetry::Telemetry,
}

/// What [`Service::configure`] returns: nothing bound, nothing started.
#[derive(Debug)]
pub struct Configured<C, V> {
    /// The effective configuration, validated.
    pub config: C,
    /// What the service's validation returned.
    pub validated: V,
    /// The telemetry settings: the `[telemetry]` section under the `OTEL_*` variables.
    pub telemetry: agentloop_telemetry::config::Resolved,
}

/// The outcome of [`Service::prepare`] when nothing is wrong.
#[derive(Debug)]
pub enum Prepared<C, V> {
    /// Go on and serve.
    Serve(Started<C, V>),
    /// `--dump-config`: this TOML is the whole output; nothing was bound.
    Dump(String),
}

/// Why a service cannot start. Every variant is a configuration the operator must fix,
/// so [`Service::start`] exits with [`EXIT_BAD_CONFIG`](crate::EXIT_BAD_CONFIG) for each.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The layered configuration could not be loaded.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The service's validation refused the configuration (its message).
    #[error("{0}")]
    Invalid(String),
    /// The listen address cannot be bound (taken, not local, no permission): the
    /// configuration names an address this host cannot serve on.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The configured address.
        address: SocketAddr,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// The service would listen beyond loopback without authenticating its callers, and
    /// the operator did not say `--insecure-no-auth`.
    #[error(
        "refusing to listen on {address} without authentication: anyone reaching it could \
         call every RPC; configure authentication, listen on loopback, or pass \
         --insecure-no-auth"
    )]
    Unauthenticated {
        /// The configured address.
        address: SocketAddr,
    },
    /// The `[telemetry]` section is invalid, or its exporter cannot be built.
    #[error("{0}")]
    Telemetry(String),
    /// `--dump-config` cannot express the configuration in TOML (an integer above
    /// `i64::MAX`, which TOML has no room for).
    #[error("cannot print the configuration as TOML: {0}")]
    Dump(#[from] toml::ser::Error),
}

/// Whether a server may listen on `address`: beyond loopback only when it authenticates
/// its callers, or when the operator said `insecure_no_auth` (then with a warning in the
/// log). For [`Service::start`] and for `agentloop dev`, which binds the same way.
///
/// # Errors
///
/// [`StartError::Unauthenticated`] when it may not.
pub fn exposure(
    address: SocketAddr,
    authenticated: bool,
    insecure_no_auth: bool,
) -> Result<(), StartError> {
    if address.ip().is_loopback() || authenticated {
        return Ok(());
    }
    if !insecure_no_auth {
        return Err(StartError::Unauthenticated { address });
    }
    tracing::warn!(
        %address,
        "listening beyond loopback WITHOUT authentication (--insecure-no-auth)"
    );
    Ok(())
}

/// The client settings a service calls the others with: its service token
/// (`service_token_file`) and its TLS (`client_tls`), files read; the default timeouts.
///
/// # Errors
///
/// A message naming the key whose file cannot be read or used.
pub fn client_config(
    settings: &ClientSettings,
) -> Result<agentloop_proto::client::ClientConfig, String> {
    let token = settings
        .service_token_file
        .as_deref()
        .map(agentloop_auth::read_secret_file)
        .transpose()
        .map_err(|e| format!("service_token_file: {e}"))?;
    let tls = settings
        .client_tls
        .as_ref()
        .map(crate::ClientTlsFiles::load)
        .transpose()?;
    agentloop_proto::client::ClientConfig::default()
        .with_tls(tls)
        .with_bearer(token.as_deref())
        .map_err(|e| format!("service_token_file: {e}"))
}

/// A service binary, known by its name. Everything else is derived from the name, so
/// no main can get it out of step: `agentloop-demo-executor` reads
/// `AGENTLOOP_DEMO_EXECUTOR_*` variables and `AGENTLOOP_DEMO_EXECUTOR_CONFIG`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Service {
    name: &'static str,
    about: &'static str,
}

impl Service {
    /// The service whose binary is called `name` (`agentloop-ledger`).
    pub const fn new(name: &'static str) -> Self {
        Self { name, about: "" }
    }

    /// The same service, described by `about` in its `--help`.
    #[must_use]
    pub const fn about(self, about: &'static str) -> Self {
        Self { about, ..self }
    }

    /// The binary's name, which prefixes its error messages and log lines.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// Prefix of its configuration variables: the name in upper case, `-` as `_`, then
    /// `_` (`AGENTLOOP_LEDGER_`).
    pub fn env_prefix(&self) -> String {
        format!("{}_", self.name.to_ascii_uppercase().replace('-', "_"))
    }

    /// The variable that names the configuration file when `--config` is not given
    /// (`AGENTLOOP_LEDGER_CONFIG`).
    pub fn config_env(&self) -> String {
        format!("{}{}", self.env_prefix(), config::FILE_KEY)
    }

    /// Parses the command line into the common flags and the service's own (`S`),
    /// exiting as clap does on `--help`, `--version` or a malformed flag (code 2).
    ///
    /// The help names this service, its [`Service::config_env`] and its default listen
    /// address (from `C::default()`), which a derive attribute shared by six binaries
    /// cannot spell.
    pub fn parse<S, C>(&self) -> Flags<S>
    where
        S: clap::Args,
        C: ServiceConfig,
    {
        let mut command = self.command::<Flags<S>, C>();
        let mut matches = command.get_matches_mut();
        <Flags<S> as clap::FromArgMatches>::from_arg_matches_mut(&mut matches)
            .unwrap_or_else(|error| error.format(&mut command).exit())
    }

    /// `F`'s command, named and described as this service, with the help of the common
    /// flags made specific to it.
    fn command<F, C>(&self) -> clap::Command
    where
        F: clap::CommandFactory,
        C: ServiceConfig,
    {
        let config_env = self.config_env();
        let listen = C::default().server().listen;
        let with_help = |arg: clap::Arg, extra: String| {
            let help = match arg.get_help() {
                Some(help) => format!("{help} {extra}"),
                None => extra,
            };
            arg.help(help)
        };
        let command = F::command()
            .name(self.name)
            .bin_name(self.name)
            .about(self.about)
            .version(env!("CARGO_PKG_VERSION"));
        command.mut_args(|arg| match arg.get_id().as_str() {
            "config" => with_help(arg, format!("[env: {config_env}]")),
            "listen" => with_help(arg, format!("[default: {listen}]")),
            _ => arg,
        })
    }

    /// The common start of a service binary. In order:
    ///
    /// 1. installs the rustls crypto provider (validation may build HTTP clients);
    /// 2. loads the layered configuration: defaults, the file (`--config`, else
    ///    [`Service::config_env`]), [`Service::env_prefix`] variables, `overrides`
    ///    (the binary's flags, common ones included);
    /// 3. runs `validate`, the service's checks of what serde cannot check: they must
    ///    not need the network, since `--dump-config` runs them too; checks the
    ///    `[telemetry]` section with the `OTEL_*` variables;
    /// 4. sets up the log in the configured format, except with `--dump-config` (the
    ///    log writes to stdout, which then carries the TOML alone);
    /// 5. refuses an address beyond loopback when callers are not authenticated, unless
    ///    `insecure_no_auth` says to go on (with a warning);
    /// 6. with `--dump-config`, prints the configuration and exits 0;
    /// 7. binds `listen` and `metrics_listen` (serving `/metrics` there), starts the
    ///    tracer when an OTLP endpoint is configured, and logs the bound address.
    ///
    /// Any failure exits with [`EXIT_BAD_CONFIG`](crate::EXIT_BAD_CONFIG) (78) and
    /// `<service>: bad configuration: <why>` on stderr, e.g. `agentloop-ledger: bad
    /// configuration: cannot listen on 127.0.0.1:50055: Address already in use`.
    pub async fn start<C, V, E>(
        &self,
        flags: &CommonFlags,
        overrides: impl Serialize,
        validate: impl FnOnce(&C) -> Result<V, E>,
    ) -> Started<C, V>
    where
        C: ServiceConfig,
        E: Display,
    {
        crate::install_crypto_provider();
        let log = |resolved: &agentloop_telemetry::config::Resolved| {
            if !flags.dump_config {
                crate::init_log(self.name, resolved.log_format);
            }
        };
        match self
            .prepare_with(flags, overrides, config::process_env(), validate, log)
            .await
        {
            Ok(Prepared::Serve(mut started)) => {
                crate::set_process_telemetry(&started.telemetry);
                if let Some(listener) = started.metrics_listener.take() {
                    let metrics = started.telemetry.metrics().clone();
                    tokio::spawn(async move {
                        if let Err(error) = agentloop_telemetry::metrics::serve(
                            listener,
                            metrics,
                            std::future::pending(),
                        )
                        .await
                        {
                            tracing::error!(%error, "the metrics endpoint stopped");
                        }
                    });
                }
                let address = started
                    .listener
                    .local_addr()
                    .unwrap_or_else(|_| started.config.server().listen);
                tracing::info!(service = self.name, %address, "listening");
                started
            }
            Ok(Prepared::Dump(toml)) => {
                let mut stdout = std::io::stdout().lock();
                if let Err(error) = stdout
                    .write_all(toml.as_bytes())
                    .and_then(|()| stdout.flush())
                {
                    eprintln!("{}: cannot write the configuration: {error}", self.name);
                    std::process::exit(1);
                }
                std::process::exit(0)
            }
            Err(error) => self.exit_bad_config(&error),
        }
    }

    /// Steps 2 to 7 of [`Service::start`] without exiting and with the environment
    /// passed in, so tests neither end their process nor change its environment.
    pub async fn prepare<C, V, E>(
        &self,
        flags: &CommonFlags,
        overrides: impl Serialize,
        env: impl IntoIterator<Item = (String, String)>,
        validate: impl FnOnce(&C) -> Result<V, E>,
    ) -> Result<Prepared<C, V>, StartError>
    where
        C: ServiceConfig,
        E: Display,
    {
        self.prepare_with(flags, overrides, env, validate, |_| ())
            .await
    }

    /// [`Service::prepare`], calling `loaded` with the telemetry settings once the
    /// configuration is valid (the log is set up there, before anything is logged about
    /// the start).
    async fn prepare_with<C, V, E>(
        &self,
        flags: &CommonFlags,
        overrides: impl Serialize,
        env: impl IntoIterator<Item = (String, String)>,
        validate: impl FnOnce(&C) -> Result<V, E>,
        loaded: impl FnOnce(&agentloop_telemetry::config::Resolved),
    ) -> Result<Prepared<C, V>, StartError>
    where
        C: ServiceConfig,
        E: Display,
    {
        let Configured {
            config,
            validated,
            telemetry: resolved,
        } = self.configure(flags, overrides, env, validate)?;
        loaded(&resolved);
        let server = config.server();
        let address = server.listen;
        exposure(address, server.auth.is_on(), server.insecure_no_auth)?;
        if flags.dump_config {
            return Ok(Prepared::Dump(dump::to_toml(self.name, &config)?));
        }
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| StartError::Listen { address, source })?;
        let metrics_listener = match config.server().metrics_listen {
            Some(address) => Some(
                TcpListener::bind(address)
                    .await
                    .map_err(|source| StartError::Listen { address, source })?,
            ),
            None => None,
        };
        let telemetry =
            agentloop_telemetry::Telemetry::start(&resolved, agentloop_telemetry::Metrics::new())
                .map_err(|error| StartError::Telemetry(error.to_string()))?;
        Ok(Prepared::Serve(Started {
            config,
            validated,
            listener,
            metrics_listener,
            telemetry,
        }))
    }

    /// Steps 2 and 3 of [`Service::start`] alone, for a process that binds and serves by
    /// itself (`agentloop dev` and `run` embed the orchestrator): the layered
    /// configuration, validated, and its telemetry settings resolved with the `OTEL_*`
    /// variables of `env`.
    ///
    /// # Errors
    ///
    /// [`StartError::Config`], [`StartError::Invalid`] or [`StartError::Telemetry`].
    pub fn configure<C, V, E>(
        &self,
        flags: &CommonFlags,
        overrides: impl Serialize,
        env: impl IntoIterator<Item = (String, String)>,
        validate: impl FnOnce(&C) -> Result<V, E>,
    ) -> Result<Configured<C, V>, StartError>
    where
        C: ServiceConfig,
        E: Display,
    {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let config_env = self.config_env();
        // The flag wins; an empty variable counts as unset, as with clap's `env`.
        let file = flags.config.clone().or_else(|| {
            env.iter()
                .find(|(key, value)| *key == config_env && !value.is_empty())
                .map(|(_, value)| PathBuf::from(value))
        });
        let layers =
            config::layers::<C>(file.as_deref(), env.clone(), &self.env_prefix(), overrides)?;
        // The shared settings on their own first: flattened into `C`, a bad value among
        // them would be reported without its key and the layer it came from.
        let extract = |figment: &figment::Figment| -> Result<C, ConfigError> {
            figment.extract::<ServerSettings<C::Auth>>()?;
            figment.extract::<ClientSettings>()?;
            Ok(figment.extract()?)
        };
        let config = extract(&layers)?;
        let validated =
            validate(&config).map_err(|error| StartError::Invalid(error.to_string()))?;
        let telemetry = config
            .server()
            .telemetry
            .resolve(self.name, env)
            .map_err(StartError::Telemetry)?;
        Ok(Configured {
            config,
            validated,
            telemetry,
        })
    }

    /// A service binary's whole `main`: parses the flags (the common ones and `Own`),
    /// starts as [`Service::start`] does, runs `serve` on what started, and sends the
    /// spans still buffered before the process ends, whether `serve` failed or not.
    pub async fn main<Own, C, V, E, R>(
        &self,
        validate: impl FnOnce(&C) -> Result<V, E>,
        serve: impl AsyncFnOnce(Started<C, V>) -> Result<(), R>,
    ) -> Result<(), R>
    where
        Own: clap::Args + Serialize,
        C: ServiceConfig,
        E: Display,
    {
        let flags = self.parse::<Own, C>();
        let started = self.start(&flags.common, &flags, validate).await;
        let telemetry = started.telemetry.clone();
        let served = serve(started).await;
        telemetry.shutdown().await;
        served
    }

    /// Who may reach a service configured by `config`: the callers its `[auth]` accepts
    /// and its listener's `[server_tls]`, their files read. A file that cannot be read,
    /// or a caller known by a SPIFFE ID without mutual TLS, exits as a bad configuration.
    pub fn access<C>(&self, config: &C) -> crate::Access
    where
        C: ServiceConfig<Auth = agentloop_auth::CallersConfig>,
    {
        let server = config.server();
        crate::Access::load(&server.auth, server.server_tls.as_ref())
            .unwrap_or_else(|e| self.exit_bad_config(&e))
    }

    /// How this service calls the others: [`client_config`], exiting as a bad
    /// configuration when a file cannot be read.
    pub fn client(&self, settings: &ClientSettings) -> agentloop_proto::client::ClientConfig {
        client_config(settings).unwrap_or_else(|e| self.exit_bad_config(&e))
    }

    /// [`exit_bad_config`](crate::exit_bad_config) under this service's name, for the
    /// problems a main finds after the start (an endpoint, a registry file).
    pub fn exit_bad_config(&self, error: &dyn Display) -> ! {
        crate::exit_bad_config(self.name, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Callers authenticated or not, as the test says.
    #[derive(Debug, Default, Serialize, serde::Deserialize)]
    #[serde(default)]
    struct Toggle {
        on: bool,
    }

    impl CallerAuth for Toggle {
        fn is_on(&self) -> bool {
            self.on
        }
    }

    #[derive(Debug, Serialize, serde::Deserialize)]
    #[serde(default)]
    struct Config {
        #[serde(flatten)]
        server: ServerSettings<Toggle>,
        #[serde(flatten)]
        unknown: crate::UnknownKeys,
    }

    impl Default for Config {
        fn default() -> Self {
            Config {
                server: ServerSettings::on_port(50099),
                unknown: crate::UnknownKeys,
            }
        }
    }

    impl ServiceConfig for Config {
        type Auth = Toggle;

        fn server(&self) -> &ServerSettings<Toggle> {
            &self.server
        }
    }

    #[tokio::test]
    async fn beyond_loopback_needs_authentication_or_the_operators_leave() {
        let service = Service::new("agentloop-test");
        let start = async |env: &[(&str, &str)], flags: CommonFlags| {
            let env = env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<Vec<_>>();
            service
                .prepare::<Config, (), String>(&flags, &flags, env, |_| Ok(()))
                .await
        };
        let public = CommonFlags {
            listen: Some(SocketAddr::from(([0, 0, 0, 0], 0))),
            ..CommonFlags::default()
        };
        match start(&[], public.clone()).await {
            Err(error @ StartError::Unauthenticated { .. }) => {
                assert!(error.to_string().contains("--insecure-no-auth"), "{error}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let authenticated = [("AGENTLOOP_TEST_AUTH__ON", "true")];
        assert!(matches!(
            start(&authenticated, public.clone()).await,
            Ok(Prepared::Serve(_))
        ));
        let leave = CommonFlags {
            insecure_no_auth: true,
            ..public
        };
        assert!(matches!(start(&[], leave).await, Ok(Prepared::Serve(_))));
        // Loopback needs neither.
        let local = CommonFlags {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            ..CommonFlags::default()
        };
        assert!(matches!(start(&[], local).await, Ok(Prepared::Serve(_))));
    }

    #[derive(Debug, clap::Args, Serialize)]
    struct Own {
        /// A flag of the service's own.
        #[arg(long)]
        own: Option<String>,
    }

    #[test]
    fn the_help_names_the_service_variable_and_default_address() {
        let service = Service::new("agentloop-test").about("The test service");
        let mut command = service.command::<Flags<Own>, Config>();
        let help = command.render_help().to_string();
        for expected in [
            "TOML configuration file; it must exist [env: AGENTLOOP_TEST_CONFIG]",
            "[default: 127.0.0.1:50099]",
            "--dump-config",
            "REDACTED",
            "A flag of the service's own",
            "The test service",
        ] {
            assert!(help.contains(expected), "{expected:?} not in:\n{help}");
        }
        let matches = command
            .try_get_matches_from(["agentloop-test", "--listen", "[::1]:7", "--own", "x"])
            .unwrap();
        let flags = <Flags<Own> as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
        assert_eq!(
            flags.common.listen,
            Some(SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], 7)))
        );
        assert_eq!(flags.own.own.as_deref(), Some("x"));
        assert!(!flags.common.dump_config);
    }
}
