//! A stdio server: the child process and the transport over its stdin and stdout.
//!
//! rmcp's own child-process transport skips lines it cannot parse and drops lines over
//! its size limit, keeping the connection open; the call they answered then waits for
//! its deadline. A gateway must not let a server get away with that, so this transport
//! reads the lines itself, and the first one that is oversized or not a JSON-RPC message
//! cuts the server off, with the reason recorded for the calls that were waiting (see
//! [`Fault`]). Notifications of methods this client does not know are skipped, as the
//! MCP SDKs do.
//!
//! The child gets a minimal environment (the config's `INHERITED_ENV` plus its own), its
//! stderr goes to tracing (bounded), and it is killed when the transport is dropped. A
//! server that forks must exit when its stdin closes: only the child itself is killed.

use std::collections::BTreeMap;
use std::io;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::link::{Fault, FaultKind};
use crate::logs::{Admit, Budget, Lines};

/// Largest message a server may send, in bytes (one line of JSON): a larger one cuts the
/// server off. gRPC's own bound, so nothing the gateway could not pass on is buffered.
pub const MAX_MESSAGE_BYTES: usize = agentloop_proto::MAX_MESSAGE_BYTES;
/// How long a server may take to exit after its stdin is closed before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// How long the last stderr lines of an exited server are waited for.
const STDERR_DRAIN: Duration = Duration::from_millis(500);

/// Why a message could not be written; the server cannot have read any of it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StdioError {
    /// The transport was closed.
    #[error("the server's stdin is closed")]
    Closed,
    /// The write failed: the server closed its stdin or exited.
    #[error("cannot write to the server's stdin: {0}")]
    Write(io::Error),
    /// The message could not be encoded.
    #[error("cannot encode the message: {0}")]
    Encode(serde_json::Error),
}

/// The transport over a child's stdin and stdout.
pub(crate) struct StdioTransport {
    server: Arc<str>,
    reader: BufReader<ChildStdout>,
    line: Vec<u8>,
    stdin: Arc<Mutex<Option<ChildStdin>>>,
    child: Option<Child>,
    pid: Option<u32>,
    fault: Arc<Fault>,
    stderr: Option<JoinHandle<()>>,
    _stop_stderr: DropGuard,
}

impl std::fmt::Debug for StdioTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdioTransport")
            .field("server", &self.server)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// Starts `command` with exactly `env` as its environment.
pub(crate) fn spawn(
    server: &Arc<str>,
    command: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    fault: Arc<Fault>,
) -> io::Result<StdioTransport> {
    let mut child = Command::new(command)
        .args(args)
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let missing = |what: &str| io::Error::other(format!("the child has no {what}"));
    let stdin = child.stdin.take().ok_or_else(|| missing("stdin"))?;
    let stdout = child.stdout.take().ok_or_else(|| missing("stdout"))?;
    let stop_stderr = CancellationToken::new();
    let stderr = child
        .stderr
        .take()
        .map(|stderr| tokio::spawn(log_stderr(Arc::clone(server), stderr, stop_stderr.clone())));
    Ok(StdioTransport {
        server: Arc::clone(server),
        reader: BufReader::new(stdout),
        line: Vec::new(),
        stdin: Arc::new(Mutex::new(Some(stdin))),
        pid: child.id(),
        child: Some(child),
        fault,
        stderr,
        _stop_stderr: stop_stderr.drop_guard(),
    })
}

impl StdioTransport {
    /// The child's process ID.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.pid
    }
}

impl Transport<RoleClient> for StdioTransport {
    type Error = StdioError;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), StdioError>> + Send + 'static {
        let stdin = Arc::clone(&self.stdin);
        async move {
            let mut line = serde_json::to_vec(&item).map_err(StdioError::Encode)?;
            line.push(b'\n');
            let mut stdin = stdin.lock().await;
            let Some(stdin) = stdin.as_mut() else {
                return Err(StdioError::Closed);
            };
            stdin.write_all(&line).await.map_err(StdioError::Write)?;
            stdin.flush().await.map_err(StdioError::Write)
        }
    }

    /// Cancel-safe, as the service loop needs: a partly read line stays in `self.line`.
    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        loop {
            match read_line(&mut self.reader, &mut self.line, MAX_MESSAGE_BYTES).await {
                Read::Line => {}
                Read::Eof => {
                    self.fault.lost("the server closed its stdout".to_owned());
                    return None;
                }
                Read::Failed(e) => {
                    self.fault
                        .lost(format!("reading the server's stdout failed: {e}"));
                    return None;
                }
                Read::TooLong => {
                    self.fault.violation(
                        &self.server,
                        format!("it sent a message larger than {MAX_MESSAGE_BYTES} bytes"),
                    );
                    return None;
                }
            }
            let decoded = decode(&self.line);
            self.line.clear();
            match decoded {
                Decoded::Message(message) => return Some(*message),
                Decoded::Skipped => {}
                Decoded::Malformed(reason) => {
                    self.fault
                        .violation(&self.server, format!("it sent {reason} on stdout"));
                    return None;
                }
            }
        }
    }

    /// Closes stdin and reaps the child: a server that was cut off is killed at once,
    /// one that is shut down gets [`EXIT_GRACE`] to exit on its own first.
    async fn close(&mut self) -> Result<(), StdioError> {
        drop(self.stdin.lock().await.take());
        if let Some(mut child) = self.child.take() {
            let cut_off = matches!(self.fault.get(), Some((FaultKind::Violation, _)));
            let exited = if cut_off {
                None
            } else {
                tokio::time::timeout(EXIT_GRACE, child.wait()).await.ok()
            };
            let status = match exited {
                Some(status) => status,
                None => {
                    let _ = child.start_kill();
                    child.wait().await
                }
            };
            match status {
                Ok(status) => self.fault.lost(format!("the server exited ({status})")),
                Err(e) => self
                    .fault
                    .lost(format!("the server could not be reaped: {e}")),
            }
        }
        if let Some(stderr) = self.stderr.take() {
            // Its last words, if it said any; the drop guard stops the task after this.
            let _ = tokio::time::timeout(STDERR_DRAIN, stderr).await;
        }
        Ok(())
    }
}

/// What one bounded line read found.
#[derive(Debug)]
enum Read {
    /// A whole line (without its newline) is in the buffer.
    Line,
    /// The line is longer than the bound.
    TooLong,
    /// The stream ended.
    Eof,
    /// Reading failed.
    Failed(io::Error),
}

/// Reads one line into `line`, never holding more than `max` bytes of it. Cancel-safe:
/// bytes are moved from the reader's buffer to `line` with no await in between, so a
/// cancelled read leaves its partial line in `line` for the next call.
async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> Read {
    loop {
        let (used, done) = {
            let available = match reader.fill_buf().await {
                Ok(available) => available,
                Err(e) => return Read::Failed(e),
            };
            if available.is_empty() {
                return Read::Eof;
            }
            let (take, used, done) = match available.iter().position(|b| *b == b'\n') {
                Some(at) => (at, at + 1, true),
                None => (available.len(), available.len(), false),
            };
            if line.len() + take > max {
                return Read::TooLong;
            }
            line.extend_from_slice(&available[..take]);
            (used, done)
        };
        reader.consume(used);
        if done {
            return Read::Line;
        }
    }
}

/// What one line of a server's stdout is.
#[derive(Debug)]
enum Decoded {
    /// Boxed: a message is large, and most lines are one.
    Message(Box<ServerJsonRpcMessage>),
    /// An empty line, or a notification of a method this client does not know.
    Skipped,
    /// Not a JSON-RPC message; says what it was.
    Malformed(String),
}

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

fn decode(line: &[u8]) -> Decoded {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(UTF8_BOM).unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Decoded::Skipped;
    }
    let error = match serde_json::from_slice::<ServerJsonRpcMessage>(line) {
        Ok(message) => return Decoded::Message(Box::new(message)),
        Err(error) => error,
    };
    match serde_json::from_slice::<serde_json::Value>(line) {
        Ok(serde_json::Value::Object(object))
            if !object.contains_key("id")
                && object
                    .get("method")
                    .is_some_and(serde_json::Value::is_string) =>
        {
            tracing::debug!(method = ?object.get("method"), "skipping an unknown notification");
            Decoded::Skipped
        }
        Ok(_) => Decoded::Malformed(format!(
            "a JSON value that is not a JSON-RPC message ({error})"
        )),
        Err(_) => {
            let start = String::from_utf8_lossy(&line[..line.len().min(64)]).into_owned();
            Decoded::Malformed(format!("a line that is not JSON, starting {start:?}"))
        }
    }
}

/// Logs the server's stderr line by line until it closes (or the transport goes).
async fn log_stderr(server: Arc<str>, mut stderr: ChildStderr, stop: CancellationToken) {
    let mut lines = Lines::default();
    let mut budget = Budget::new(tokio::time::Instant::now());
    let mut chunk = vec![0; 8192];
    let mut log = |line: &[u8], cut: bool| match budget.admit(tokio::time::Instant::now()) {
        Admit::Yes { dropped } => {
            let text = String::from_utf8_lossy(line);
            tracing::info!(server = %server, cut, dropped_before = dropped, "stderr: {text}");
        }
        Admit::No => {}
    };
    loop {
        let read = tokio::select! {
            () = stop.cancelled() => break,
            read = stderr.read(&mut chunk) => read,
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => lines.push(&chunk[..n], &mut log),
        }
    }
    lines.finish(&mut log);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::wildcard_enum_match_arm)]

    use super::*;

    #[tokio::test]
    async fn lines_are_read_within_the_bound() {
        let mut input: &[u8] = b"{\"a\":1}\nabcdef\n";
        let mut line = Vec::new();
        assert!(matches!(
            read_line(&mut input, &mut line, 16).await,
            Read::Line
        ));
        assert_eq!(line, b"{\"a\":1}");
        line.clear();
        assert!(matches!(
            read_line(&mut input, &mut line, 3).await,
            Read::TooLong
        ));
        line.clear();
        let mut rest: &[u8] = b"no newline";
        assert!(matches!(
            read_line(&mut rest, &mut line, 64).await,
            Read::Eof
        ));
    }

    #[test]
    fn lines_are_messages_skipped_or_malformed() {
        let response = br#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
        assert!(matches!(decode(response), Decoded::Message(_)));
        let with_bom = [UTF8_BOM, response.as_slice(), b"\r"].concat();
        assert!(matches!(decode(&with_bom), Decoded::Message(_)));
        assert!(matches!(decode(b"   "), Decoded::Skipped));
        // Notifications nobody waits on are passed on or skipped, never fatal.
        for notification in [
            br#"{"jsonrpc":"2.0","method":"notifications/vendor/thing","params":{}}"#.as_slice(),
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":7}"#,
        ] {
            let decoded = decode(notification);
            assert!(!matches!(decoded, Decoded::Malformed(_)), "{decoded:?}");
        }
        match decode(b"Starting server on stdio...") {
            Decoded::Malformed(reason) => assert!(reason.contains("not JSON"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(decode(b"[1, 2]"), Decoded::Malformed(_)));
    }
}
