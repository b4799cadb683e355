//! A stdio server's stderr goes to the gateway's log, under the server's name. Alone in
//! its test binary, because it installs the process's global subscriber.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use agentloop_mcp::Supervision;
use common::*;

#[tokio::test]
async fn what_a_server_writes_to_stderr_is_logged_under_its_name() {
    if !available("python3", "apt-get install python3") {
        return;
    }
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    // Global, in a test binary of its own: a thread's default subscriber would race
    // with the other tests' threads over which log lines are enabled.
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let executor = start(fake_config("fake", "normal"), Supervision::default());
    wait_up(&executor).await;
    eventually("the server's stderr in the log", || async {
        let text = logs.text();
        text.lines()
            .find(|line| line.contains("fake MCP server starting in mode normal"))
            .map(|line| assert!(line.contains("server=fake"), "{line}"))
    })
    .await;
    executor.shutdown().await;
}

/// A log sink the test can read.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}
