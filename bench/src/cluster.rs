//! The production overlay as processes on this machine, started and stopped through
//! `deploy/local/cluster`: what `agentloop bench --mode cluster` measures and the
//! end-to-end cluster test kills an orchestrator of.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agentloop_proto::client::{ClientConfig, Transport, connect};
use agentloop_proto::v1::orchestrator_service_client::OrchestratorServiceClient;
use anyhow::{Context, bail};

/// The script, where it is in the repository this binary was built from.
pub fn default_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/cluster")
}

/// Ports the script takes from its `--port-base`: ten for the services, ten more for
/// their metrics, with gaps.
const PORTS: u16 = 17;

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// `deploy/local/cluster`.
    pub script: PathBuf,
    /// The folder of the service binaries and `agentloop`.
    pub bin_dir: PathBuf,
    /// The folder the cluster's own temporary folder goes in (the system's if unset).
    pub parent_dir: Option<PathBuf>,
    /// The orchestrators' event store.
    pub database_url: String,
    /// The effect ledger's store.
    pub ledger_database_url: String,
    /// The orchestrators' leases.
    pub redis_url: String,
    /// Variables for the processes of a service, as `AGENTLOOP_<SERVICE>_KEY=VALUE`.
    pub env: Vec<String>,
    /// Each process on a host of its own: the network namespaces `<prefix>-<process>`
    /// (`agentloop chaos` makes them).
    pub netns: Option<String>,
}

/// A running local cluster; stopped (SIGTERM, a drain) when dropped.
#[derive(Debug)]
pub struct LocalCluster {
    script: PathBuf,
    dir: tempfile::TempDir,
    /// `cluster.env`: the orchestrators' endpoints and metrics addresses, the token
    /// file, every process's PID.
    env: BTreeMap<String, String>,
    /// `down` ran: nothing is left to stop.
    stopped: bool,
}

impl LocalCluster {
    /// Starts every process and returns once each answers SERVING.
    ///
    /// # Errors
    ///
    /// When no ports are free, the script is missing, or it fails (its output is in the
    /// error).
    pub async fn up(options: &ClusterOptions) -> anyhow::Result<LocalCluster> {
        if !options.script.is_file() {
            bail!(
                "{} is missing: the cluster is started by the repository's deploy/local/cluster \
                 (--cluster-script names it)",
                options.script.display()
            );
        }
        let dir = match &options.parent_dir {
            Some(parent) => tempfile::tempdir_in(parent),
            None => tempfile::tempdir(),
        }
        .context("cannot create the cluster's folder")?;
        let mut command = tokio::process::Command::new("bash");
        command
            .arg(&options.script)
            .arg("up")
            .arg("--dir")
            .arg(dir.path())
            .args(["--database-url", &options.database_url])
            .args(["--ledger-database-url", &options.ledger_database_url])
            .args(["--redis-url", &options.redis_url])
            .arg("--bin-dir")
            .arg(&options.bin_dir)
            .args(["--port-base", &free_port_base()?.to_string()]);
        for variable in &options.env {
            command.args(["--env", variable]);
        }
        if let Some(prefix) = &options.netns {
            command.args(["--netns", prefix]);
        }
        let output = command
            .stdin(Stdio::null())
            .output()
            .await
            .context("cannot run bash")?;
        // From here on, dropping the value stops whatever the script started.
        let mut cluster = LocalCluster {
            script: options.script.clone(),
            dir,
            env: BTreeMap::new(),
            stopped: false,
        };
        if !output.status.success() {
            bail!(
                "{} up failed: {}{}",
                options.script.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let env_file = cluster.dir.path().join("cluster.env");
        cluster.env = std::fs::read_to_string(&env_file)
            .with_context(|| format!("cannot read {}", env_file.display()))?
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Ok(cluster)
    }

    /// A value of `cluster.env`.
    ///
    /// # Errors
    ///
    /// When the script wrote no such key.
    pub fn get(&self, key: &str) -> anyhow::Result<&str> {
        self.env
            .get(key)
            .map(String::as_str)
            .with_context(|| format!("cluster.env has no {key}"))
    }

    /// Every process, by name (`orchestrator-0`, `policy`, ...), with its PID.
    pub fn pids(&self) -> BTreeMap<String, u32> {
        self.env
            .iter()
            .filter_map(|(key, value)| {
                let name = key.strip_prefix("PID_")?;
                Some((
                    name.to_ascii_lowercase().replace('_', "-"),
                    value.parse().ok()?,
                ))
            })
            .collect()
    }

    /// The orchestrators' public endpoints.
    pub fn orchestrators(&self) -> anyhow::Result<[&str; 2]> {
        Ok([self.get("ORCHESTRATOR_0")?, self.get("ORCHESTRATOR_1")?])
    }

    /// A client of orchestrator `endpoint` carrying the caller's token, with no
    /// deadline (a watch lasts as long as its invocation).
    ///
    /// # Errors
    ///
    /// When the token cannot be read or the endpoint cannot be reached.
    pub async fn client(
        &self,
        endpoint: &str,
    ) -> anyhow::Result<OrchestratorServiceClient<Transport>> {
        let file = self.get("TOKEN_FILE")?;
        let token = std::fs::read_to_string(file).with_context(|| format!("cannot read {file}"))?;
        let config = ClientConfig::default()
            .with_request_timeout(None)
            .with_bearer(Some(token.trim()))?;
        let channel = tokio::time::timeout(Duration::from_secs(10), connect(endpoint, config))
            .await
            .with_context(|| format!("{endpoint} did not answer within 10 s"))??;
        Ok(agentloop_proto::client::orchestrator(channel))
    }

    /// A process's data directory (the demo executor's holds its record).
    pub fn data_dir(&self, process: &str) -> std::path::PathBuf {
        self.dir.path().join("data").join(process)
    }

    /// A process's log (empty if it has none).
    pub fn log(&self, process: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("logs/{process}.log")))
            .unwrap_or_default()
    }

    /// Stops every process: SIGTERM (a drain), then SIGKILL for any still there after
    /// 30 s.
    ///
    /// # Errors
    ///
    /// When the script fails.
    pub async fn down(mut self) -> anyhow::Result<()> {
        self.stopped = true;
        let status = tokio::process::Command::new("bash")
            .args(self.down_args())
            .stdin(Stdio::null())
            .status()
            .await?;
        if !status.success() {
            bail!("{} down failed: {status}", self.script.display());
        }
        Ok(())
    }

    fn down_args(&self) -> [&std::ffi::OsStr; 4] {
        [
            self.script.as_os_str(),
            "down".as_ref(),
            "--dir".as_ref(),
            self.dir.path().as_os_str(),
        ]
    }
}

/// However its owner ends (an error, a failed assertion), the processes stop.
impl Drop for LocalCluster {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        let stopped = std::process::Command::new("bash")
            .args(self.down_args())
            .stdin(Stdio::null())
            .status();
        if !stopped.is_ok_and(|status| status.success()) {
            tracing::warn!(dir = %self.dir.path().display(), "the local cluster did not stop cleanly");
        }
    }
}

/// [`PORTS`] consecutive free loopback ports below the ephemeral range (where port-0
/// listeners land), as the script's `--port-base`; where the search starts depends on
/// the process, so that clusters started at once look in different places first.
fn free_port_base() -> anyhow::Result<u16> {
    const LOW: u16 = 20_000;
    const SPAN: u16 = 8_000;
    let start = (std::process::id() % u32::from(SPAN / 20)) as u16 * 20;
    (0..SPAN / 20)
        .map(|n| LOW + (start + n * 20) % SPAN)
        .find(|base| {
            (0..PORTS)
                .all(|offset| std::net::TcpListener::bind(("127.0.0.1", base + offset)).is_ok())
        })
        .with_context(|| format!("no {PORTS} free ports in {LOW}..{}", LOW + SPAN))
}
