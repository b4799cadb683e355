//! The hand-off queue: keys of work a worker gave up (it drained, or it was full) that an
//! idle worker should pick up now rather than at its next orphan sweep.
//!
//! A hand-off is only a hint. The lease decides who runs the work, so a key taken twice,
//! or taken by a worker that then fails to acquire its lease, costs one failed acquisition
//! and nothing else; a key that is lost (the queue was trimmed, Redis restarted without
//! persistence) is found by the next sweep. That is why the queue may drop the oldest
//! entries when it is full instead of refusing new ones.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::Notify;

use crate::redis_backend::classify;
use crate::{LeaseError, validate};

/// Most keys a queue holds; beyond it the oldest are dropped (see the module docs).
pub const MAX_QUEUED: usize = 10_000;

/// A queue of runnable keys shared by the workers. Object-safe.
#[async_trait]
pub trait Handoff: Send + Sync + std::fmt::Debug {
    /// Offers `key` to the next worker that takes one.
    async fn offer(&self, key: &str) -> Result<(), LeaseError>;

    /// The oldest offered key, waiting up to the backend's wait bound for one; `None`
    /// when none came.
    async fn take(&self) -> Result<Option<String>, LeaseError>;
}

/// The embedded hand-off: a bounded in-memory queue for the workers of one process.
#[derive(Debug)]
pub struct InProcessHandoff {
    queue: Mutex<VecDeque<String>>,
    offered: Notify,
    wait: Duration,
}

impl InProcessHandoff {
    /// A queue whose `take` waits up to `wait`.
    pub fn new(wait: Duration) -> Self {
        Self {
            queue: Mutex::new(VecDeque::new()),
            offered: Notify::new(),
            wait,
        }
    }

    fn pop(&self) -> Option<String> {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
    }
}

#[async_trait]
impl Handoff for InProcessHandoff {
    async fn offer(&self, key: &str) -> Result<(), LeaseError> {
        validate(key, None, None)?;
        {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            if queue.len() == MAX_QUEUED {
                queue.pop_front();
            }
            queue.push_back(key.to_owned());
        }
        self.offered.notify_one();
        Ok(())
    }

    async fn take(&self) -> Result<Option<String>, LeaseError> {
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            // Register interest before looking, so an offer in between is not missed.
            let offered = self.offered.notified();
            if let Some(key) = self.pop() {
                return Ok(Some(key));
            }
            if tokio::time::timeout_at(deadline, offered).await.is_err() {
                return Ok(self.pop());
            }
        }
    }
}

/// The hand-off in a Redis list shared by every worker: `LPUSH` + `LTRIM` to offer,
/// `BRPOP` to take (oldest first).
///
/// `BRPOP` holds its connection while it waits, so takes go through a connection of their
/// own; offers share nothing with them.
#[derive(Debug)]
pub struct RedisHandoff {
    offers: ConnectionManager,
    takes: ConnectionManager,
    key: String,
    wait: Duration,
    command_timeout: Duration,
}

impl RedisHandoff {
    /// A queue at `key` (e.g. `agentloop:runnable`) on the Redis at `url`. `take` blocks up
    /// to `wait` (at least 10 ms: Redis counts the timeout in 10 ms steps); every other
    /// command is bounded by `command_timeout`. Like [`crate::RedisLeases::new`], a Redis
    /// that is down now makes the calls fail, not the constructor.
    pub fn new(
        url: &str,
        key: impl Into<String>,
        wait: Duration,
        command_timeout: Duration,
    ) -> Result<Self, LeaseError> {
        let client = redis::Client::open(url)
            .map_err(|e| LeaseError::InvalidArgument(format!("redis url: {e}")))?;
        let wait = wait.max(Duration::from_millis(10));
        let manager = |response: Duration| {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(command_timeout))
                .set_response_timeout(Some(response))
                .set_number_of_retries(1);
            ConnectionManager::new_lazy_with_config(client.clone(), config).map_err(classify)
        };
        Ok(Self {
            offers: manager(command_timeout)?,
            takes: manager(wait + command_timeout)?,
            key: key.into(),
            wait,
            command_timeout,
        })
    }
}

#[async_trait]
impl Handoff for RedisHandoff {
    async fn offer(&self, key: &str) -> Result<(), LeaseError> {
        validate(key, None, None)?;
        let mut connection = self.offers.clone();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .lpush(&self.key, key)
            .ignore()
            .ltrim(
                &self.key,
                0,
                isize::try_from(MAX_QUEUED - 1).unwrap_or(isize::MAX),
            )
            .ignore();
        match tokio::time::timeout(
            self.command_timeout,
            pipe.query_async::<()>(&mut connection),
        )
        .await
        {
            Ok(result) => result.map_err(classify),
            Err(_elapsed) => Err(LeaseError::Timeout(self.command_timeout)),
        }
    }

    async fn take(&self) -> Result<Option<String>, LeaseError> {
        let mut connection = self.takes.clone();
        let bound = self.wait + self.command_timeout;
        let mut command = redis::cmd("BRPOP");
        command.arg(&self.key).arg(self.wait.as_secs_f64());
        let popped = command.query_async::<Option<(String, String)>>(&mut connection);
        match tokio::time::timeout(bound, popped).await {
            Ok(result) => Ok(result.map_err(classify)?.map(|(_list, key)| key)),
            Err(_elapsed) => Err(LeaseError::Timeout(bound)),
        }
    }
}
