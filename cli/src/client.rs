//! The CLI's commands against an orchestrator's public gRPC API. The embedded default
//! serves that same API on a loopback port, so `run` and `demo` take one code path
//! whether the orchestrator is embedded or deployed.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use agentloop_proto::client::{ClientConfig, Transport, connect};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::orchestrator_service_client::OrchestratorServiceClient;
use anyhow::{Context, bail};
use futures::StreamExt;

use crate::exit;
use crate::view::{EventView, Row, Summary, Waiting, reason_of};

/// The demo's example: two parallel read-only lookups, then an answer built from them,
/// citing both.
pub const DEMO_SCRIPT: &str = r#"{
  "turns": [
    {"tool_calls": [
      {"id": "call-profile", "name": "lookup", "arguments": {"key": "profile"}},
      {"id": "call-policy", "name": "lookup", "arguments": {"key": "policy"}}
    ]},
    {"final": "profile=active; policy=refund-under-100", "evidence": ["call-profile", "call-policy"]}
  ]
}"#;

/// Largest script file the CLI reads.
const MAX_SCRIPT_FILE: u64 = 4 * 1024 * 1024;
/// Times a lost watch stream is reopened before the run gives up.
const WATCH_RETRIES: u32 = 5;
/// How often live progress is refreshed on a terminal.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// What `run` starts.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The goal.
    pub goal: String,
    /// The scripted model, as JSON text.
    pub script: String,
    /// JSON summary instead of text.
    pub json: bool,
    /// Idempotency key.
    pub idempotency_key: Option<String>,
    /// Budget overrides.
    pub max_steps: Option<u32>,
    /// Budget overrides.
    pub max_tool_calls: Option<u32>,
    /// Budget overrides.
    pub max_repeated_plan: Option<u32>,
    /// Budget overrides.
    pub deadline: Option<Duration>,
    /// Budget overrides: the cost budget.
    pub max_cost: Option<agentloop_engine::MicroUsd>,
    /// Budget overrides: the longest wait for a human.
    pub max_wait: Option<Duration>,
    /// The actor's roles (with a token, the token's).
    pub roles: Vec<String>,
}

/// Reads a script file, refusing oversized ones before reading them.
pub fn read_script(path: &Path) -> anyhow::Result<String> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("cannot read the script {}", path.display()))?
        .len();
    if size > MAX_SCRIPT_FILE {
        bail!(
            "the script {} is {size} bytes; at most {MAX_SCRIPT_FILE} are allowed",
            path.display()
        );
    }
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the script {}", path.display()))
}

/// Parses `500ms`, `30s`, `5m`, `1h` (a bare number is milliseconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 30s, 5m or 1h"))?;
    let millis = match unit {
        "" | "ms" => Some(value),
        "s" => value.checked_mul(1_000),
        "m" => value.checked_mul(60_000),
        "h" => value.checked_mul(3_600_000),
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}; use ms, s, m or h"
            ));
        }
    };
    let millis = millis.ok_or_else(|| format!("{text:?} is too long"))?;
    if millis == 0 {
        return Err("a deadline must be longer than 0".into());
    }
    Ok(Duration::from_millis(millis))
}

/// An orchestrator to call, and the caller's token (`--token`, `AGENTLOOP_TOKEN`) when
/// it authenticates its callers.
#[derive(Clone, Copy)]
pub struct Server<'a> {
    /// `http://host:port`.
    pub endpoint: &'a str,
    /// A bearer token (a JWT), sent with every call.
    pub token: Option<&'a str>,
}

impl std::fmt::Debug for Server<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.map(|_| "REDACTED"))
            .finish()
    }
}

/// A client of `server`'s orchestrator.
pub async fn client(server: Server<'_>) -> anyhow::Result<OrchestratorServiceClient<Transport>> {
    let Server {
        endpoint: server,
        token,
    } = server;
    let config = ClientConfig::default()
        .with_request_timeout(None)
        .with_bearer(token)?;
    let channel = connect(server, config)
        .await
        .with_context(|| format!("cannot reach the orchestrator at {server}"))?;
    Ok(agentloop_proto::client::orchestrator(channel))
}

pub(crate) fn status(context: &str, status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{context}: {:?}: {}", status.code(), status.message())
}

/// What `run` and the replies do when the invocation they follow stops to wait for a
/// human.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnWait {
    /// Print how to resume it, and keep following it after the reply.
    Follow,
    /// Print how to resume it, and exit with the waiting reason's code.
    Exit,
}

impl OnWait {
    /// Follow on a terminal (someone is there to reply from another one), exit
    /// otherwise (a script must not hang on a human).
    pub fn default_for_terminal() -> OnWait {
        if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
            OnWait::Follow
        } else {
            OnWait::Exit
        }
    }
}

/// How to follow an invocation to its end.
#[derive(Debug, Clone)]
pub struct Follow {
    /// JSON summary instead of text.
    pub json: bool,
    /// When it waits for a human.
    pub on_wait: OnWait,
    /// Appended to the printed commands that resume a waiting invocation, so they reach
    /// the same orchestrator (`--server URL`) or data directory (`--data-dir DIR`).
    pub resume_flags: String,
    /// Only watching (`agentloop watch`): every event is printed to stdout as it commits
    /// (text, or JSON lines), and Ctrl-C stops watching instead of cancelling.
    pub watcher: bool,
}

/// Starts an invocation and follows it: live progress on a terminal, then the summary.
/// Ctrl-C cancels the invocation (a second one leaves without waiting); while it waits
/// for a human, Ctrl-C leaves it waiting. Returns the exit code of its terminal reason.
pub async fn run(server: Server<'_>, options: RunOptions, follow: Follow) -> anyhow::Result<u8> {
    let started = Instant::now();
    let mut orchestrator = client(server).await?;
    let response = orchestrator
        .start_invocation(start_request(options))
        .await
        .map_err(|s| status("the orchestrator refused the invocation", s))?
        .into_inner();
    let invocation = response
        .invocation
        .context("the orchestrator answered without an invocation")?;
    follow_to_end(
        &mut orchestrator,
        &invocation.invocation_id,
        1,
        started,
        &follow,
    )
    .await
}

/// The start request `options` describe.
pub fn start_request(options: RunOptions) -> pb::StartInvocationRequest {
    pb::StartInvocationRequest {
        idempotency_key: options.idempotency_key.unwrap_or_default(),
        goal: options.goal,
        scripted_model_json: options.script,
        budget_overrides: Some(pb::BudgetOverrides {
            max_steps: options.max_steps,
            max_tool_calls: options.max_tool_calls,
            max_tokens: None,
            max_repeated_plan: options.max_repeated_plan,
            deadline: options.deadline.map(prost_types_duration),
            max_cost_micro_usd: options.max_cost.map(|max| max.0),
            max_wait: options.max_wait.map(prost_types_duration),
        }),
        roles: options.roles,
        ..Default::default()
    }
}

/// Follows invocation `id` from event `from_seq` until it ends (or waits, when
/// `on_wait` says so), then prints the summary. Returns the exit code of its reason.
pub async fn follow_to_end(
    orchestrator: &mut OrchestratorServiceClient<Transport>,
    id: &str,
    from_seq: u64,
    started: Instant,
    follow: &Follow,
) -> anyhow::Result<u8> {
    let id = id.to_owned();
    let progress = Progress::new(!follow.json && std::io::stderr().is_terminal());
    progress.note(&format!("invocation {id}"));

    let mut next = from_seq;
    let mut turn_events = 0;
    let mut retries = 0;
    let mut cancelled = false;
    let mut waiting = false;
    let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
    // Live progress between commits: the orchestrator's view of the turn in flight.
    let mut ticker = tokio::time::interval(PROGRESS_EVERY);
    'watch: loop {
        let mut stream = match orchestrator
            .watch_invocation(pb::WatchInvocationRequest {
                invocation_id: id.clone(),
                from_seq: next,
            })
            .await
        {
            Ok(stream) => stream.into_inner(),
            Err(s) if retries < WATCH_RETRIES => {
                retries += 1;
                progress.note(&format!("watch failed ({}), reconnecting", s.message()));
                continue;
            }
            Err(s) => return Err(status("cannot watch the invocation", s)),
        };
        loop {
            tokio::select! {
                signal = &mut ctrl_c => {
                    signal.context("cannot listen for Ctrl-C")?;
                    if follow.watcher && !waiting {
                        progress.clear();
                        eprintln!("agentloop: stopped watching; invocation {id} goes on");
                        return Ok(exit::INTERRUPTED);
                    }
                    if waiting {
                        // Nothing runs: leave it waiting for its human.
                        progress.clear();
                        break 'watch;
                    }
                    if cancelled {
                        progress.clear();
                        eprintln!("agentloop: left without waiting; invocation {id} is being cancelled");
                        return Ok(exit::code(agentloop_engine::TerminalReason::Cancelled));
                    }
                    cancelled = true;
                    progress.note("cancelling (Ctrl-C again to leave without waiting)");
                    orchestrator
                        .cancel_invocation(pb::CancelInvocationRequest { invocation_id: id.clone(), reason: "Ctrl-C".into() })
                        .await
                        .map_err(|s| status("cannot cancel", s))?;
                    ctrl_c.set(tokio::signal::ctrl_c());
                }
                _ = ticker.tick(), if progress.enabled && !waiting => {
                    let live = orchestrator
                        .get_invocation(pb::GetInvocationRequest { invocation_id: id.clone() })
                        .await;
                    if let Ok(live) = live
                        && let Some(live) = live.into_inner().invocation
                    {
                        progress.live(live.current_turn, live.calls_in_flight, started.elapsed());
                    }
                }
                item = stream.next() => match item {
                    Some(Ok(pb::WatchInvocationResponse { event: Some(event) })) => {
                        next = event.seq + 1;
                        let view = EventView::of(&event);
                        if view.kind == "turn" {
                            turn_events += 1;
                        }
                        match follow.watcher {
                            true => print_events(std::slice::from_ref(&event), follow.json)?,
                            false => progress.show(&view, started.elapsed()),
                        }
                        waiting = view.kind == "waiting";
                        if view.kind == "ended" {
                            break 'watch;
                        }
                        if waiting {
                            progress.clear();
                            // Exiting, the summary says what it waits for.
                            if follow.on_wait == OnWait::Exit {
                                break 'watch;
                            }
                            let now = get(orchestrator, &id).await?;
                            if let Some(notice) = Waiting::of(&now, &follow.resume_flags) {
                                eprintln!("{}", notice.render());
                            }
                            eprintln!("following it: it goes on after the reply (Ctrl-C leaves it waiting)");
                        }
                    }
                    Some(Ok(pb::WatchInvocationResponse { event: None })) => {}
                    Some(Err(s)) if retries < WATCH_RETRIES => {
                        retries += 1;
                        progress.note(&format!("watch interrupted ({}), resuming from event {next}", s.message()));
                        continue 'watch;
                    }
                    Some(Err(s)) => return Err(status("the watch failed", s)),
                    None => continue 'watch,
                },
            }
        }
    }
    progress.clear();
    let ended = get(orchestrator, &id).await?;
    let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let summary = Summary::of(&ended, turn_events, elapsed, &follow.resume_flags);
    print_summary(&summary, follow.json)?;
    Ok(reason_of(ended.terminal_reason).map_or(exit::FAILURE, exit::code))
}

/// The invocation as the orchestrator has it now.
pub async fn get(
    orchestrator: &mut OrchestratorServiceClient<Transport>,
    id: &str,
) -> anyhow::Result<pb::Invocation> {
    orchestrator
        .get_invocation(pb::GetInvocationRequest {
            invocation_id: id.to_owned(),
        })
        .await
        .map_err(|s| status("cannot read the invocation", s))?
        .into_inner()
        .invocation
        .context("the orchestrator answered without an invocation")
}

fn prost_types_duration(duration: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
    }
}

fn print_summary(summary: &Summary, json: bool) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut stdout, summary)?;
        writeln!(stdout)?;
    } else {
        writeln!(stdout, "{}", summary.render())?;
    }
    Ok(())
}

fn print_events(events: &[pb::Event], json: bool) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    for event in events {
        let view = EventView::of(event);
        if json {
            serde_json::to_writer(&mut stdout, &view)?;
            writeln!(stdout)?;
        } else {
            writeln!(stdout, "{}", view.render())?;
        }
    }
    Ok(())
}

/// The most invocations asked for in one page.
const LIST_PAGE: usize = 200;

/// The invocations the caller may see that `filter`'s filters select, newest first, at
/// most `limit` (its page fields are set here).
pub(crate) async fn invocations(
    orchestrator: &mut OrchestratorServiceClient<Transport>,
    filter: &pb::ListInvocationsRequest,
    limit: usize,
) -> anyhow::Result<Vec<pb::Invocation>> {
    let mut invocations = Vec::new();
    let mut page_token = String::new();
    while invocations.len() < limit {
        let page = orchestrator
            .list_invocations(pb::ListInvocationsRequest {
                page_size: u32::try_from((limit - invocations.len()).min(LIST_PAGE)).unwrap_or(0),
                page_token,
                ..filter.clone()
            })
            .await
            .map_err(|s| status("cannot list the invocations", s))?
            .into_inner();
        invocations.extend(page.invocations);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    invocations.truncate(limit);
    Ok(invocations)
}

/// Prints `rows`, one per line: as JSON, or as `render` says; `none` when there are none
/// (as text).
pub(crate) fn print_rows<T: serde::Serialize>(
    rows: &[T],
    json: bool,
    none: &str,
    render: impl Fn(&T) -> String,
) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    if !json && rows.is_empty() {
        writeln!(stdout, "{none}")?;
    }
    for row in rows {
        if json {
            serde_json::to_writer(&mut stdout, row)?;
            writeln!(stdout)?;
        } else {
            writeln!(stdout, "{}", render(row))?;
        }
    }
    Ok(())
}

/// `list`: the invocations the caller may see that `filter` selects, newest first, at
/// most `limit`.
pub async fn list(
    server: Server<'_>,
    filter: &pb::ListInvocationsRequest,
    limit: usize,
    json: bool,
) -> anyhow::Result<u8> {
    let mut orchestrator = client(server).await?;
    let rows: Vec<Row> = invocations(&mut orchestrator, filter, limit)
        .await?
        .iter()
        .map(Row::of)
        .collect();
    print_rows(&rows, json, "no invocations", Row::render)?;
    Ok(0)
}

/// `show` against a running orchestrator: the events committed so far.
pub async fn show_remote(server: Server<'_>, id: &str, json: bool) -> anyhow::Result<u8> {
    let mut orchestrator = client(server).await?;
    let invocation = get(&mut orchestrator, id).await?;
    let mut events = Vec::new();
    if invocation.last_seq > 0 {
        let mut stream = orchestrator
            .watch_invocation(pb::WatchInvocationRequest {
                invocation_id: id.to_owned(),
                from_seq: 1,
            })
            .await
            .map_err(|s| status("cannot read the events", s))?
            .into_inner();
        while let Some(item) = stream.next().await {
            let event = item.map_err(|s| status("cannot read the events", s))?.event;
            if let Some(event) = event {
                let last = event.seq >= invocation.last_seq;
                events.push(event);
                if last {
                    break;
                }
            }
        }
    }
    print_events(&events, json)?;
    Ok(0)
}

/// `show` on the embedded data directory, read directly.
pub async fn show_local(data_dir: &Path, id: &str, json: bool) -> anyhow::Result<u8> {
    let events = agentloop_stack::read_events(data_dir, id).await?;
    print_events(&events, json)?;
    Ok(0)
}

/// How long `health` waits between two questions, and for one answer.
const HEALTH_RETRY: Duration = Duration::from_millis(100);
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// `health`: asks `endpoint` about `service` until it answers SERVING or `wait` has
/// passed. A process that is still starting (refused connections) or draining
/// (NOT_SERVING) is asked again; the last answer is printed when it never serves.
pub async fn health(endpoint: &str, service: &str, wait: Duration) -> anyhow::Result<u8> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let until = Instant::now() + wait;
    loop {
        let config = ClientConfig::default()
            .with_connect_timeout(HEALTH_TIMEOUT)
            .with_request_timeout(Some(HEALTH_TIMEOUT));
        let answer = match connect(endpoint, config).await {
            Ok(channel) => HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: service.to_owned(),
                })
                .await
                .map(|response| response.into_inner().status())
                .map_err(|s| status("health check", s)),
            Err(error) => {
                Err(anyhow::Error::new(error).context(format!("cannot reach {endpoint}")))
            }
        };
        let last = match answer {
            Ok(ServingStatus::Serving) => {
                println!("SERVING");
                return Ok(0);
            }
            Ok(other) => other.as_str_name().to_owned(),
            Err(error) => format!("{error:#}"),
        };
        if Instant::now() + HEALTH_RETRY > until {
            eprintln!("agentloop: {endpoint}: {last}");
            return Ok(exit::FAILURE);
        }
        tokio::time::sleep(HEALTH_RETRY).await;
    }
}

/// `cancel` on a running orchestrator.
pub async fn cancel(server: Server<'_>, id: &str, reason: &str) -> anyhow::Result<u8> {
    let mut orchestrator = client(server).await?;
    let invocation = orchestrator
        .cancel_invocation(pb::CancelInvocationRequest {
            invocation_id: id.to_owned(),
            reason: reason.to_owned(),
        })
        .await
        .map_err(|s| status("cannot cancel", s))?
        .into_inner()
        .invocation
        .context("the orchestrator answered without an invocation")?;
    let reason = agentloop_wire::reason_name(invocation.terminal_reason);
    match invocation.state() {
        // A waiting invocation is cancelled at once.
        pb::InvocationState::Ended if reason == "cancelled" => {
            println!("invocation {id} is cancelled");
        }
        pb::InvocationState::Ended => println!("invocation {id} had already ended: {reason}"),
        pb::InvocationState::Running
        | pb::InvocationState::Pending
        | pb::InvocationState::Waiting
        | pb::InvocationState::Unspecified => println!("cancel requested for invocation {id}"),
    }
    Ok(0)
}

/// Live progress on stderr, only when it is a terminal.
struct Progress {
    enabled: bool,
}

impl Progress {
    fn new(enabled: bool) -> Progress {
        Progress { enabled }
    }

    fn show(&self, view: &EventView, elapsed: Duration) {
        if !self.enabled {
            return;
        }
        let line = match view.kind {
            "turn" => {
                let done = view.calls.iter().filter(|c| c.outcome != "none").count();
                format!(
                    "turn {} committed · {} · {done} call(s) done · {:.1}s",
                    view.turn.unwrap_or(0),
                    view.decision.unwrap_or("?"),
                    elapsed.as_secs_f64()
                )
            }
            other => format!("{other} · {:.1}s", elapsed.as_secs_f64()),
        };
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[2K{line}");
        let _ = stderr.flush();
    }

    fn live(&self, turn: u32, in_flight: u32, elapsed: Duration) {
        if !self.enabled || turn == 0 {
            return;
        }
        let line = format!(
            "turn {turn} · {in_flight} call(s) in flight · {:.1}s",
            elapsed.as_secs_f64()
        );
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[2K{line}");
        let _ = stderr.flush();
    }

    fn note(&self, text: &str) {
        if self.enabled {
            let mut stderr = std::io::stderr().lock();
            let _ = writeln!(stderr, "\r\x1b[2K{text}");
        }
    }

    fn clear(&self) {
        if self.enabled {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[2K");
            let _ = stderr.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
    }
}
