//! Keeping one server connected: connect, watch, and reconnect with backoff.
//!
//! One task per executor runs [`supervise`] until the executor's shutdown token fires.
//! It connects (spawning a stdio server or opening an HTTP session) and initializes;
//! then it publishes the connection and waits for it to end: the server exits or closes
//! its stream, the transport or a call cuts it off ([`Fault`]), a ping goes unanswered,
//! or shutdown. Then it unpublishes the connection, so calls fail at once with
//! UNAVAILABLE instead of waiting, and connects again after a backoff that doubles from
//! `initial_backoff` up to `max_backoff`, and starts over once a connection stayed up
//! for `stable_after`.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use rmcp::model::{ClientRequest, PingRequest};
use rmcp::service::{RunningService, ServiceError};
use rmcp::{RoleClient, ServiceExt};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::config::Endpoint;
use crate::elicit::{Elicitation, Questions};
use crate::link::{Fault, Link};
use crate::{http, stdio};

/// Longest wait for a connection's service task to finish once it is told to stop.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// How an executor keeps its server connected. [`Supervision::default`] is what a
/// deployment wants; tests and embedders may change the backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Supervision {
    initial_backoff: Duration,
    max_backoff: Duration,
    stable_after: Duration,
    init_timeout: Duration,
    ping_interval: Duration,
    ping_timeout: Duration,
}

impl Default for Supervision {
    /// Reconnects after 100 ms, doubling to 30 s; a connection up for 30 s resets the
    /// backoff. A server has 30 s to start and initialize, and is pinged every 30 s
    /// (10 s to answer), so an HTTP server that went away is noticed between calls too.
    fn default() -> Self {
        Supervision {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
            stable_after: Duration::from_secs(30),
            init_timeout: Duration::from_secs(30),
            ping_interval: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(10),
        }
    }
}

impl Supervision {
    /// Reconnects after `initial`, doubling up to `max` (at least `initial`).
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max.max(initial);
        self
    }
}

/// The executor's view of its server, for the gateway to report unavailable tools.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Health {
    /// Starting the server or opening its session, and initializing; `connection`
    /// counts attempts from 1.
    Connecting {
        /// Which attempt this is.
        connection: u64,
    },
    /// Initialized: calls are sent to it.
    Up {
        /// The attempt that succeeded; a new value means a new process or session.
        connection: u64,
        /// The process ID of a stdio server.
        pid: Option<u32>,
    },
    /// Not connected; calls fail at once with UNAVAILABLE until it is up again.
    Down {
        /// Why, for operators (the server's name is in the log line).
        reason: String,
        /// When the next attempt starts.
        retry_in: Duration,
    },
    /// The executor was shut down.
    Stopped,
}

impl Health {
    /// Whether calls are sent to the server now.
    pub fn is_up(&self) -> bool {
        match self {
            Health::Up { .. } => true,
            Health::Connecting { .. } | Health::Down { .. } | Health::Stopped => false,
        }
    }
}

/// What the executor and its supervisor share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) name: Arc<str>,
    pub(crate) endpoint: Endpoint,
    pub(crate) supervision: Supervision,
    /// The calls in flight, for the questions the server asks during them.
    pub(crate) questions: Arc<Questions>,
    link: RwLock<Option<Link>>,
    health: watch::Sender<Health>,
}

impl Shared {
    pub(crate) fn new(
        name: Arc<str>,
        endpoint: Endpoint,
        supervision: Supervision,
        elicitation: Elicitation,
    ) -> Shared {
        Shared {
            name,
            endpoint,
            supervision,
            questions: Arc::new(Questions::new(elicitation)),
            link: RwLock::new(None),
            health: watch::Sender::new(Health::Connecting { connection: 1 }),
        }
    }

    /// The current connection, if the server is up.
    pub(crate) fn link(&self) -> Option<Link> {
        // A poisoned lock only means a writer panicked between two plain stores.
        self.link
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_link(&self, link: Option<Link>) {
        *self
            .link
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = link;
    }

    pub(crate) fn health(&self) -> Health {
        self.health.borrow().clone()
    }

    pub(crate) fn watch_health(&self) -> watch::Receiver<Health> {
        self.health.subscribe()
    }
}

/// Delays between attempts: `initial`, doubled each time, at most `max`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            next: initial,
        }
    }

    fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// A connection that initialized.
struct Session {
    running: RunningService<RoleClient, Client>,
    pid: Option<u32>,
}

/// Keeps the server connected until `shutdown` fires (module docs).
pub(crate) async fn supervise(shared: Arc<Shared>, shutdown: CancellationToken) {
    let server = Arc::clone(&shared.name);
    let supervision = shared.supervision.clone();
    let mut backoff = Backoff::new(supervision.initial_backoff, supervision.max_backoff);
    let mut connection = 0;
    loop {
        connection += 1;
        shared
            .health
            .send_replace(Health::Connecting { connection });
        let fault = Arc::new(Fault::default());
        let connected = tokio::select! {
            () = shutdown.cancelled() => break,
            connected = tokio::time::timeout(
                supervision.init_timeout,
                connect(&shared, Arc::clone(&fault)),
            ) => connected,
        };
        let reason = match connected {
            Err(_elapsed) => format!(
                "it did not initialize within {:?}",
                supervision.init_timeout
            ),
            Ok(Err(reason)) => reason,
            Ok(Ok(session)) => {
                let started = Instant::now();
                shared.set_link(Some(Link {
                    peer: session.running.peer().clone(),
                    fault: Arc::clone(&fault),
                }));
                shared.health.send_replace(Health::Up {
                    connection,
                    pid: session.pid,
                });
                tracing::info!(server = %server, connection, pid = session.pid, "MCP server connected");
                let reason = watch_session(&supervision, session.running, &fault, &shutdown).await;
                shared.set_link(None);
                if started.elapsed() >= supervision.stable_after {
                    backoff.reset();
                }
                reason
            }
        };
        if shutdown.is_cancelled() {
            break;
        }
        let retry_in = backoff.next_delay();
        let reason = agentloop_proto::bounded_message(reason);
        tracing::warn!(server = %server, %reason, ?retry_in, "MCP server is down; reconnecting");
        shared
            .health
            .send_replace(Health::Down { reason, retry_in });
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(retry_in) => {}
        }
    }
    shared.set_link(None);
    shared.health.send_replace(Health::Stopped);
    tracing::info!(server = %server, "MCP executor stopped");
}

/// Starts the server or opens its session, and initializes.
async fn connect(shared: &Shared, fault: Arc<Fault>) -> Result<Session, String> {
    let client = Client::new(Arc::clone(&shared.name), Arc::clone(&shared.questions));
    let initialized = |error: rmcp::service::ClientInitializeError| {
        let mut reason = format!("initialization failed: {error}");
        if let Some((_, why)) = fault.get() {
            reason = format!("{reason} ({why})");
        }
        reason
    };
    match &shared.endpoint {
        Endpoint::Stdio { command, args, env } => {
            let transport = stdio::spawn(&shared.name, command, args, env, Arc::clone(&fault))
                .map_err(|e| format!("cannot start {command:?}: {e}"))?;
            let pid = transport.pid();
            let running = client.serve(transport).await.map_err(initialized)?;
            Ok(Session { running, pid })
        }
        Endpoint::Http {
            client: http_client,
            url,
            headers,
            bearer_token,
            oauth,
        } => {
            let transport = http::transport(
                http_client,
                url,
                headers,
                bearer_token.as_deref(),
                oauth.as_ref(),
            );
            let running = client.serve(transport).await.map_err(initialized)?;
            Ok(Session { running, pid: None })
        }
    }
}

/// Waits for the connection to end and says why; pings it meanwhile.
async fn watch_session(
    supervision: &Supervision,
    running: RunningService<RoleClient, Client>,
    fault: &Fault,
    shutdown: &CancellationToken,
) -> String {
    let peer = running.peer().clone();
    let mut stop = Some(running.cancellation_token());
    let waiting = running.waiting();
    tokio::pin!(waiting);
    let mut ping = tokio::time::interval_at(
        Instant::now() + supervision.ping_interval,
        supervision.ping_interval,
    );
    ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            ended = &mut waiting => {
                let why = match ended {
                    Ok(_) => "the connection closed".to_owned(),
                    Err(e) => format!("its service task failed: {e}"),
                };
                return fault.get().map_or(why, |(_, reason)| reason.clone());
            }
            () = shutdown.cancelled() => {
                if let Some(stop) = stop.take() {
                    stop.cancel();
                }
                let _ = tokio::time::timeout(STOP_WAIT, &mut waiting).await;
                return "the executor stopped".to_owned();
            }
            () = fault.cut() => {
                if let Some(stop) = stop.take() {
                    stop.cancel();
                }
                let _ = tokio::time::timeout(STOP_WAIT, &mut waiting).await;
                return fault.get().map_or_else(|| "cut off".to_owned(), |(_, reason)| reason.clone());
            }
            _ = ping.tick() => {
                let request = ClientRequest::PingRequest(PingRequest::default());
                tokio::select! {
                    answer = tokio::time::timeout(supervision.ping_timeout, peer.send_request(request)) => {
                        match answer {
                            // An error reply is still a reply: the server is there.
                            Ok(Ok(_) | Err(ServiceError::McpError(_))) => {}
                            Ok(Err(e)) => fault.lost(format!("a ping failed: {e}")),
                            Err(_) => fault.lost(format!(
                                "it did not answer a ping within {:?}",
                                supervision.ping_timeout
                            )),
                        }
                    }
                    () = fault.cut() => {}
                    () = shutdown.cancelled() => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_to_its_bound_and_starts_over() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        let delays: Vec<u64> = (0..11)
            .map(|_| u64::try_from(backoff.next_delay().as_millis()).unwrap_or(u64::MAX))
            .collect();
        assert_eq!(
            delays,
            [
                100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000
            ]
        );
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn only_up_is_up() {
        assert!(
            Health::Up {
                connection: 1,
                pid: None
            }
            .is_up()
        );
        assert!(!Health::Connecting { connection: 1 }.is_up());
        assert!(!Health::Stopped.is_up());
        assert!(
            !Health::Down {
                reason: "r".into(),
                retry_in: Duration::ZERO
            }
            .is_up()
        );
    }
}
