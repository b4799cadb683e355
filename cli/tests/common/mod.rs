//! What the binary's tests share: the `agentloop` command in a directory, and
//! `agentloop dev` running beside a test.
#![allow(dead_code, reason = "each test binary uses a part")]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Output, Stdio};

/// What a finished command printed on stdout.
pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What a finished command printed on stderr.
pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `agentloop` in `dir`, with nothing from the environment that would change its
/// caller or its configuration.
pub(crate) fn agentloop(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    command
        .current_dir(dir)
        .env_remove("AGENTLOOP_TOKEN")
        .env_remove("AGENTLOOP_ORCHESTRATOR_CONFIG");
    command
}

/// `agentloop dev` until dropped. Its stdout stays open while it runs: a closed pipe
/// would end it at its next line.
pub(crate) struct Dev {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Dev {
    /// The next line it prints, trimmed.
    pub(crate) fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `dev` over the data directory `data` of `dir` with `args` (and no HTTP
/// listener unless they say `--http`), and waits for the line that names its endpoint.
pub(crate) fn dev(dir: &Path, args: &[&str]) -> (Dev, String) {
    let http: &[&str] = match args.contains(&"--http") {
        true => &[],
        false => &["--http", "off"],
    };
    let mut child = agentloop(dir)
        .args(["--data-dir", "data", "dev", "--listen", "127.0.0.1:0"])
        .args(http)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let endpoint = line
        .trim()
        .rsplit(' ')
        .next()
        .filter(|word| word.starts_with("http://"))
        .unwrap_or_else(|| panic!("no endpoint in {line:?}"))
        .to_owned();
    let dev = Dev { child, stdout };
    (dev, endpoint)
}
