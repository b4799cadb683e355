//! A throwaway `redis-server` for tests: started on a free loopback port, killed on drop.
//!
//! ```no_run
//! # async fn example() {
//! let Some(server) = agentloop_lease::testing::RedisServer::start_or_skip("my_test").await else {
//!     return; // redis-server is not installed (and AGENTLOOP_REQUIRE_REDIS is not 1)
//! };
//! let url = server.url();
//! # }
//! ```

// Test harness: a broken environment is reported by panicking, exactly as in a test.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Set to `1` to make a missing `redis-server` fail the test instead of skipping it.
pub const REQUIRE_REDIS_ENV: &str = "AGENTLOOP_REQUIRE_REDIS";

/// How long a started server may take to answer `PING`.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// A running `redis-server` owned by the test; killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    address: IpAddr,
    port: u16,
    /// The network namespace it runs in (a host of a harness's own); `None` for this one.
    namespace: Option<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server, or returns `None` after a loud message when `redis-server` is not
    /// on `PATH` — unless `AGENTLOOP_REQUIRE_REDIS=1`, then it panics.
    pub async fn start_or_skip(test: &str) -> Option<Self> {
        if !redis_installed() {
            if std::env::var(REQUIRE_REDIS_ENV).is_ok_and(|v| v == "1") {
                panic!("{test}: redis-server is not on PATH and {REQUIRE_REDIS_ENV}=1");
            }
            eprintln!(
                "\n!!!!! SKIPPED {test}: redis-server is not on PATH \
                 (set {REQUIRE_REDIS_ENV}=1 to make this a failure) !!!!!\n"
            );
            return None;
        }
        Some(Self::start().await)
    }

    /// Starts a server on a free loopback port and waits until it answers `PING`.
    pub async fn start() -> Self {
        // Ask the OS for a free port, then free it for redis-server. Another process could
        // take it in between; that shows up as a start failure, not a wrong server.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("find a free port")
            .port();
        let mut server = Self {
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port,
            namespace: None,
            child: None,
        };
        server.spawn().await;
        server
    }

    /// Starts a server on a host of a harness's own: in network namespace `namespace`,
    /// listening on `address` (one of that host's), port 6379. `agentloop chaos` cuts
    /// its links.
    pub async fn start_hosted(namespace: &str, address: IpAddr) -> Self {
        let mut server = Self {
            address,
            port: 6379,
            namespace: Some(namespace.to_owned()),
            child: None,
        };
        server.spawn().await;
        server
    }

    /// The port it listens on (stays the same across [`RedisServer::restart`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://<address>:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://{}/", SocketAddr::new(self.address, self.port))
    }

    /// Kills the server (SIGKILL: like a crash) and waits for the process to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (after [`RedisServer::kill`]); it comes
    /// back empty, as a Redis without persistence does.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    async fn spawn(&mut self) {
        // `ip netns exec` execs in place: killing the child kills the server.
        let mut command = match &self.namespace {
            Some(namespace) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", namespace, "redis-server"]);
                command
            }
            None => Command::new("redis-server"),
        };
        let child = command
            .args(["--port", &self.port.to_string()])
            .args(["--bind", &self.address.to_string()])
            .args(["--protected-mode", "no"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let started = tokio::time::Instant::now();
        loop {
            if ping(SocketAddr::new(self.address, self.port)).await {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "redis-server on port {} exited at start: {status}",
                    self.port
                );
            }
            assert!(
                started.elapsed() < READY_WITHIN,
                "redis-server on port {} did not answer PING within {READY_WITHIN:?}",
                self.port
            );
            // Polling interval of a bounded readiness wait, not synchronisation.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn redis_installed() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// One `PING` over a raw connection, bounded; `true` on `+PONG`.
async fn ping(address: SocketAddr) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream.write_all(b"PING\r\n").await?;
        let mut reply = [0u8; 7];
        stream.read_exact(&mut reply).await?;
        Ok::<_, std::io::Error>(&reply == b"+PONG\r\n")
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(500), attempt).await,
        Ok(Ok(true))
    )
}
