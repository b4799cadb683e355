//! A PostgreSQL server of the test process's own: `initdb` into a fresh folder, `postgres`
//! on a free loopback port, both gone when the process is.
//!
//! Why a supervisor shell: a test process may end any way (a panic, `exit`, a kill), and
//! Rust runs no destructor for a static. The server is therefore started under a small
//! `sh` whose standard input is a pipe the test process holds until it ends. When that
//! pipe closes (the process is gone, however it went), the shell stops the server with a
//! fast shutdown and removes its folder. The same shell also exits, with the server's log
//! on its stderr, when the server itself stops, so a start that fails is reported instead
//! of waited for.
//!
//! PostgreSQL refuses to run as root: a root process runs `initdb` and `postgres` as the
//! unprivileged `postgres` user that Debian's package creates (through `setpriv`, which
//! execs in place, so the shell signals the server itself).

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// The system user a root process runs the server as.
const SERVER_USER: &str = "postgres";

/// How long `initdb` and the server's start may take together.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// The server's settings for tests besides its address: no Unix socket (its folder would
/// be a shared one), room for many parallel tests' pools, and no fsync: the folder is
/// removed at the end, so a crash of the machine loses nothing a test needs.
const SETTINGS: &[&str] = &[
    "unix_socket_directories=",
    "max_connections=300",
    "fsync=off",
    "full_page_writes=off",
];

/// The supervisor. `$1` is the data folder, the rest the server's command line.
const SUPERVISOR: &str = r#"
dir=$1; shift
exec 3<&0
"$@" 2>"$dir/server.log" &
server=$!
( read -r _ <&3; kill -INT "$server" 2>/dev/null ) &
watcher=$!
wait "$server"
status=$?
kill "$watcher" 2>/dev/null
[ "$status" -eq 0 ] || cat "$dir/server.log" >&2
rm -rf "$dir"
exit "$status"
"#;

/// Where a server runs: on this host's loopback, or on a host of a test's own (a network
/// namespace, entered with `ip netns exec`) at an address of that host.
#[derive(Debug, Clone)]
pub(super) struct Placement {
    pub(super) namespace: Option<String>,
    pub(super) address: IpAddr,
}

impl Placement {
    pub(super) fn loopback() -> Placement {
        Placement {
            namespace: None,
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }
}

/// A running server: the process's own lives as long as the process (the value sits in a
/// static); a hosted one until it is stopped.
#[derive(Debug)]
pub(super) struct Throwaway {
    address: IpAddr,
    port: u16,
    // Held, never written: the supervisor stops the server when it closes.
    lifeline: ChildStdin,
    supervisor: Child,
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "only a test checks it is removed")
    )]
    dir: PathBuf,
}

impl Throwaway {
    /// The admin URL: the `postgres` database as the `postgres` superuser, trust auth.
    pub(super) fn admin_url(&self) -> String {
        format!(
            "postgres://postgres@{}/postgres",
            std::net::SocketAddr::new(self.address, self.port)
        )
    }

    /// Creates a cluster in a fresh folder and starts a server on it, on loopback.
    ///
    /// # Errors
    ///
    /// What a person must fix, in one line: binaries missing, no unprivileged user for a
    /// root process, `initdb` or the server failing (with its output).
    pub(super) fn start() -> Result<Throwaway, String> {
        Throwaway::start_at(&Placement::loopback())
    }

    /// [`Throwaway::start`] where `placement` says: in a network namespace of its own, the
    /// server takes PostgreSQL's usual port, 5432.
    pub(super) fn start_at(placement: &Placement) -> Result<Throwaway, String> {
        let bin = binaries()?;
        let user = RunAs::for_this_process()?;
        let dir = std::env::temp_dir().join(format!(
            "agentloop-postgres-{}",
            uuid::Uuid::new_v4().simple()
        ));
        // initdb creates the folder itself, as the user the server runs as.
        let initdb = user
            .command(&bin.join("initdb"))
            .arg("-D")
            .arg(&dir)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale"])
            .arg("--no-sync")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", bin.join("initdb").display()))?;
        if !initdb.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!(
                "initdb into {} failed ({}): {}",
                dir.display(),
                initdb.status,
                String::from_utf8_lossy(&initdb.stderr).trim()
            ));
        }
        let port = match placement.namespace {
            Some(_) => {
                // initdb trusts loopback only; the hosts of a harness's own network reach
                // it from their addresses.
                let hba = dir.join("pg_hba.conf");
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&hba)
                    .and_then(|mut file| {
                        std::io::Write::write_all(&mut file, b"host all all 0.0.0.0/0 trust\n")
                    })
                    .map_err(|e| format!("cannot extend {}: {e}", hba.display()))?;
                5432
            }
            None => free_port()?,
        };
        let mut server = user.command(&bin.join("postgres"));
        server.arg("-D").arg(&dir).arg("-p").arg(port.to_string());
        server.args(["-c", &format!("listen_addresses={}", placement.address)]);
        for setting in SETTINGS {
            server.args(["-c", setting]);
        }
        // `ip netns exec` execs in place: the supervisor still signals the server itself.
        let on_host: Vec<&str> = match &placement.namespace {
            Some(namespace) => vec!["ip", "netns", "exec", namespace],
            None => Vec::new(),
        };
        let mut supervisor = Command::new("sh")
            .args(["-c", SUPERVISOR, "sh"])
            .arg(&dir)
            .args(on_host)
            .arg(server.get_program())
            .args(server.get_args())
            .current_dir(std::env::temp_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run sh: {e}"))?;
        let lifeline = supervisor
            .stdin
            .take()
            .ok_or("the supervisor's stdin is not a pipe")?;
        wait_ready(&mut supervisor, &dir)?;
        Ok(Throwaway {
            address: placement.address,
            port,
            lifeline,
            supervisor,
            dir,
        })
    }

    /// What happens when the process ends, without ending it: closes the lifeline and
    /// waits for the supervisor, which stops the server and removes its folder.
    pub(super) fn stop(self) -> std::io::Result<std::process::ExitStatus> {
        let Throwaway {
            lifeline,
            mut supervisor,
            ..
        } = self;
        drop(lifeline);
        supervisor.wait()
    }
}

/// Waits until the server says it is ready in `postmaster.pid` (its eighth line), or
/// reports why it never will.
fn wait_ready(supervisor: &mut Child, dir: &Path) -> Result<(), String> {
    let started = Instant::now();
    let pid_file = dir.join("postmaster.pid");
    loop {
        let ready = std::fs::read_to_string(&pid_file)
            .is_ok_and(|pid| pid.lines().nth(7).is_some_and(|s| s.trim() == "ready"));
        if ready {
            return Ok(());
        }
        if let Ok(Some(status)) = supervisor.try_wait() {
            let mut log = String::new();
            if let Some(mut stderr) = supervisor.stderr.take() {
                let _ = stderr.read_to_string(&mut log);
            }
            return Err(format!(
                "the PostgreSQL server in {} stopped at start ({status}): {}",
                dir.display(),
                log.trim()
            ));
        }
        if started.elapsed() > READY_WITHIN {
            let _ = supervisor.kill();
            return Err(format!(
                "the PostgreSQL server in {} was not ready within {READY_WITHIN:?}",
                dir.display()
            ));
        }
        // The polling interval of a bounded readiness wait, not synchronisation.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The folder holding `initdb` and `postgres`: the one on `PATH`, else the newest of
/// Debian's `/usr/lib/postgresql/<version>/bin`.
fn binaries() -> Result<PathBuf, String> {
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    if let Some(dir) = on_path
        .into_iter()
        .find(|dir| dir.join("initdb").is_file() && dir.join("postgres").is_file())
    {
        return Ok(dir);
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("postgres").is_file())
                .then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version);
    newest.map(|(_, bin)| bin).ok_or_else(|| {
        "PostgreSQL's server (initdb, postgres) is neither on PATH nor in \
         /usr/lib/postgresql/*/bin: install Debian's postgresql package"
            .to_owned()
    })
}

/// Who the server runs as: this process's user, or, for root, [`SERVER_USER`].
enum RunAs {
    Me,
    ServerUser,
}

impl RunAs {
    fn for_this_process() -> Result<RunAs, String> {
        // The owner of /proc/self is the process's effective user.
        let uid = std::fs::metadata("/proc/self")
            .map_err(|e| format!("cannot tell who this process runs as: {e}"))?
            .uid();
        if uid != 0 {
            return Ok(RunAs::Me);
        }
        let known = Command::new("id")
            .args(["-u", SERVER_USER])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !known {
            return Err(format!(
                "PostgreSQL does not run as root, and there is no {SERVER_USER:?} user to run \
                 it as (Debian's postgresql package creates it)"
            ));
        }
        Ok(RunAs::ServerUser)
    }

    /// `program` as this user, from the temporary folder (the server user may not be
    /// allowed into the test's working directory).
    fn command(&self, program: &Path) -> Command {
        let mut command = match self {
            RunAs::Me => Command::new(program),
            RunAs::ServerUser => {
                let mut command = Command::new("setpriv");
                command
                    .arg(format!("--reuid={SERVER_USER}"))
                    .arg(format!("--regid={SERVER_USER}"))
                    .arg("--init-groups")
                    .arg(program);
                command
            }
        };
        command.current_dir(std::env::temp_dir());
        command
    }
}

/// A port nothing listens on now. Another process could take it before the server binds
/// it; the server then stops at start, which is reported.
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

#[cfg(test)]
mod tests {

    use super::*;

    #[tokio::test]
    async fn a_server_of_its_own_serves_then_goes_with_its_lifeline() {
        let server = match Throwaway::start() {
            Ok(server) => server,
            Err(why) if !super::super::postgres_required() => {
                eprintln!("SKIPPED: {why}");
                return;
            }
            Err(why) => panic!("{why}"),
        };
        let dir = server.dir.clone();
        assert!(dir.join("PG_VERSION").is_file(), "a cluster in {dir:?}");
        let database = super::super::PostgresServer::connect(&server.admin_url())
            .await
            .unwrap()
            .create_database()
            .await
            .unwrap();
        database.drop_database().await.unwrap();
        let status = server.stop().unwrap();
        assert!(status.success(), "a fast shutdown: {status}");
        assert!(!dir.exists(), "{dir:?} is removed with the server");
    }
}
