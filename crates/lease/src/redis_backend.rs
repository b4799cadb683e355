//! The Redis backend: several orchestrator processes share one Redis.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::places::{Admission, PlaceLimits, TenantPlaces};
use crate::{Lease, LeaseBackend, LeaseError, REVOCATION_BUFFER, Revocations, validate};

/// The pub/sub channel revocations are published on (with the default key prefix);
/// the payload is the revoked key.
pub const REVOCATION_CHANNEL: &str = "agentloop:lease:revoked";

/// Takes the lease if nobody holds it, in one atomic step, so an epoch is consumed only by
/// a successful acquisition and no client can crash between "take an epoch" and "set the
/// lease". The epoch is `max(previous + 1, server time in µs)`: `INCR` semantics, floored
/// at the Redis clock so that a Redis that lost its data (restart without persistence)
/// still hands out epochs larger than every epoch the event store has seen. The epoch
/// counter expires after `ARGV[3]` ms without an acquisition — the floor keeps epochs
/// increasing after that, and Redis does not keep one counter per invocation forever.
/// Returns the epoch as a string (Lua numbers are doubles; `%.0f` is exact below 2^53,
/// which µs timestamps stay under until the year 2255), or `false` when held.
const ACQUIRE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local epoch = tonumber(redis.call('GET', KEYS[2]) or '0') + 1
if now > epoch then epoch = now end
local e = string.format('%.0f', epoch)
redis.call('SET', KEYS[2], e, 'PX', ARGV[3])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. e, 'PX', ARGV[2])
return e
";

/// Compare-and-extend: only the exact holder (owner and epoch) may extend.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Leases renewed per pipelined round trip by [`RedisLeases`]'s `renew_many`.
const RENEW_BATCH: usize = 1_000;

/// Compare-and-delete: only the exact holder may release.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Delete and publish in one step, so no subscriber hears of a revocation that did not
/// happen and no revocation goes unannounced.
const REVOKE: &str = r"
local n = redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return n
";

/// A start of a tenant's (`ARGV[1]`, the lease key): first the places whose reservation
/// has passed and whose lease is gone are dropped; then the start is refused when the
/// tenant holds `ARGV[2]` places (`{1, 0}`), or when its bucket (`ARGV[3]` a second, `ARGV[4]`
/// at once) has no token (`{2, ms until one}`); else both are taken (`{0, 0}`), the place
/// reserved for `ARGV[5]` ms. `ARGV[6]` is the holder keys' prefix, `ARGV[7]` how long the
/// places outlive their last change. Times are the Redis clock's, in ms.
const ADMIT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max = tonumber(ARGV[2])
if max > 0 then
  local places = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #places, 2 do
    if tonumber(places[i + 1]) < now and redis.call('EXISTS', ARGV[6] .. places[i]) == 0 then
      redis.call('ZREM', KEYS[1], places[i])
    end
  end
  if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) >= max then
    return {1, 0}
  end
end
local per_s = tonumber(ARGV[3])
if per_s > 0 then
  local full = tonumber(ARGV[4]) * 1000
  local b = redis.call('HMGET', KEYS[2], 'milli', 'at')
  local milli = tonumber(b[1]) or full
  local at = tonumber(b[2]) or now
  if now > at then milli = math.min(full, milli + (now - at) * per_s) end
  if milli < 1000 then return {2, math.ceil((1000 - milli) / per_s)} end
  redis.call('HSET', KEYS[2], 'milli', milli - 1000, 'at', now)
  redis.call('PEXPIRE', KEYS[2], math.ceil(full / per_s) + 1000)
end
if max > 0 then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
end
return {0, 0}
";

/// A place held again (`ARGV[1]`), reserved for `ARGV[2]` ms beyond its lease.
const HOLD: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
";

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone)]
pub struct RedisLeaseConfig {
    /// `redis://host:port/db`.
    pub url: String,
    /// Namespace for keys and the channel: leases live at `{prefix}:holder:{key}`, epoch
    /// counters at `{prefix}:epoch:{key}`, revocations go to `{prefix}:revoked`; a
    /// tenant's places at `{prefix}:places:{tenant}` and its start bucket at
    /// `{prefix}:starts:{tenant}`.
    pub prefix: String,
    /// Bound on every command, including the wait for a connection.
    pub command_timeout: Duration,
    /// Bound on opening one connection.
    pub connect_timeout: Duration,
    /// How long an epoch counter outlives its last acquisition (see [`RedisLeases`]).
    pub epoch_retention: Duration,
    /// The longest pause between attempts to re-subscribe to revocations after the
    /// pub/sub connection broke.
    pub max_resubscribe_backoff: Duration,
}

impl RedisLeaseConfig {
    /// Defaults for `url`: key prefix `agentloop:lease`, 1 s per command, 1 s per
    /// connection attempt, epoch counters kept 7 days, re-subscription at most every 1 s.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: "agentloop:lease".to_owned(),
            command_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            epoch_retention: Duration::from_secs(7 * 24 * 60 * 60),
            max_resubscribe_backoff: Duration::from_secs(1),
        }
    }

    fn channel(&self) -> String {
        format!("{}:revoked", self.prefix)
    }
}

/// Leases in Redis: `SET`-style keys with a TTL, compared and changed by Lua scripts.
///
/// Revocations arrive on one dedicated pub/sub connection per `RedisLeases`, owned by a
/// background task (its own cancellation token and kept join handle) that re-subscribes
/// with bounded backoff after Redis restarts and fans keys out to local subscribers through
/// a broadcast channel, so a thousand keepers cost one Redis connection, not a thousand.
/// Shutdown: [`RedisLeases::shutdown`] stops the task and waits for it; dropping the value
/// stops it too, without waiting.
///
/// Commands go through a [`ConnectionManager`], which reconnects in the background; while
/// Redis is down each call fails within `command_timeout` with
/// [`LeaseError::Unavailable`] or [`LeaseError::Timeout`].
#[derive(Debug)]
pub struct RedisLeases {
    manager: ConnectionManager,
    config: RedisLeaseConfig,
    channel: String,
    revoked: broadcast::Sender<String>,
    subscribed: watch::Receiver<bool>,
    listener: Mutex<Option<JoinHandle<()>>>,
    stop: CancellationToken,
    _stop_on_drop: DropGuard,
    acquire: Script,
    renew: Script,
    release: Script,
    revoke: Script,
    admit: Script,
    hold: Script,
}

impl RedisLeases {
    /// Prepares the backend without waiting for Redis: a Redis that is down now makes the
    /// calls fail with typed errors, not the constructor. Only a malformed URL fails here.
    /// Must be called inside a Tokio runtime (it starts the revocation listener).
    pub fn new(config: RedisLeaseConfig) -> Result<Self, LeaseError> {
        let client = redis::Client::open(config.url.as_str())
            .map_err(|e| LeaseError::InvalidArgument(format!("redis url: {e}")))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.command_timeout))
            .set_number_of_retries(2)
            .set_max_delay(config.max_resubscribe_backoff);
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
            .map_err(classify)?;
        let (revoked, _) = broadcast::channel(REVOCATION_BUFFER);
        let (subscribed_tx, subscribed) = watch::channel(false);
        let stop = CancellationToken::new();
        let channel = config.channel();
        let handle = tokio::spawn(listen(
            client,
            config.clone(),
            channel.clone(),
            revoked.clone(),
            subscribed_tx,
            stop.clone(),
        ));
        Ok(Self {
            manager,
            channel,
            revoked,
            subscribed,
            listener: Mutex::new(Some(handle)),
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
            config,
            acquire: Script::new(ACQUIRE),
            renew: Script::new(RENEW),
            release: Script::new(RELEASE),
            revoke: Script::new(REVOKE),
            admit: Script::new(ADMIT),
            hold: Script::new(HOLD),
        })
    }

    /// Stops the revocation listener and waits for it to end. Existing [`Revocations`]
    /// receivers then see `Closed` once this value is dropped; lease commands still work.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        let handle = self
            .listener
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(handle) = handle {
            // The task only ends by returning; a JoinError would mean it panicked, which
            // there is nothing left to do about at shutdown.
            let _ = handle.await;
        }
    }

    fn holder_key(&self, key: &str) -> String {
        format!("{}:holder:{key}", self.config.prefix)
    }

    fn epoch_key(&self, key: &str) -> String {
        format!("{}:epoch:{key}", self.config.prefix)
    }

    fn places_key(&self, tenant: &str) -> String {
        format!("{}:places:{tenant}", self.config.prefix)
    }

    fn starts_key(&self, tenant: &str) -> String {
        format!("{}:starts:{tenant}", self.config.prefix)
    }

    /// Runs one script invocation under `command_timeout`.
    async fn run<T: redis::FromRedisValue>(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<T, LeaseError> {
        let mut connection = self.manager.clone();
        let bound = self.config.command_timeout;
        match tokio::time::timeout(bound, invocation.invoke_async(&mut connection)).await {
            Ok(result) => result.map_err(classify),
            Err(_elapsed) => Err(LeaseError::Timeout(bound)),
        }
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Connection trouble is `Unavailable`/`Timeout` (retry later); anything else is a
/// `Backend` error (a script or type error, which retrying will not fix).
pub(crate) fn classify(error: RedisError) -> LeaseError {
    if error.is_timeout() {
        LeaseError::Unavailable(format!("timed out: {error}"))
    } else if error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
    {
        LeaseError::Unavailable(error.to_string())
    } else {
        LeaseError::Backend(error.to_string())
    }
}

#[async_trait]
impl TenantPlaces for RedisLeases {
    async fn admit(
        &self,
        tenant: &str,
        key: &str,
        limits: &PlaceLimits,
    ) -> Result<Admission, LeaseError> {
        validate(key, None, Some(limits.reserve_for))?;
        let burst = match limits.start_burst {
            0 => limits.starts_per_s,
            burst => burst,
        };
        let mut invocation = self.admit.prepare_invoke();
        invocation
            .key(self.places_key(tenant))
            .key(self.starts_key(tenant))
            .arg(key)
            .arg(limits.max_running)
            .arg(limits.starts_per_s)
            .arg(burst)
            .arg(millis(limits.reserve_for))
            .arg(format!("{}:holder:", self.config.prefix))
            .arg(millis(self.config.epoch_retention));
        let (verdict, retry_ms): (u8, u64) = self.run(invocation).await?;
        Ok(match verdict {
            0 => Admission::Admitted,
            1 => Admission::Full {
                limit: limits.max_running,
            },
            _ => Admission::TooFast {
                per_s: limits.starts_per_s,
                retry_ms,
            },
        })
    }

    async fn hold(&self, tenant: &str, key: &str, limits: &PlaceLimits) -> Result<(), LeaseError> {
        validate(key, None, Some(limits.reserve_for))?;
        if limits.max_running == 0 {
            return Ok(());
        }
        let mut invocation = self.hold.prepare_invoke();
        invocation
            .key(self.places_key(tenant))
            .arg(key)
            .arg(millis(limits.reserve_for))
            .arg(millis(self.config.epoch_retention));
        let _: u8 = self.run(invocation).await?;
        Ok(())
    }

    async fn free(&self, tenant: &str, key: &str) -> Result<(), LeaseError> {
        validate(key, None, None)?;
        let mut connection = self.manager.clone();
        let bound = self.config.command_timeout;
        let mut command = redis::cmd("ZREM");
        command.arg(self.places_key(tenant)).arg(key);
        match tokio::time::timeout(bound, command.query_async::<u8>(&mut connection)).await {
            Ok(result) => result.map(drop).map_err(classify),
            Err(_elapsed) => Err(LeaseError::Timeout(bound)),
        }
    }
}

#[async_trait]
impl LeaseBackend for RedisLeases {
    async fn acquire(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, LeaseError> {
        validate(key, Some(owner), Some(ttl))?;
        let mut invocation = self.acquire.prepare_invoke();
        invocation
            .key(self.holder_key(key))
            .key(self.epoch_key(key))
            .arg(owner)
            .arg(millis(ttl))
            .arg(millis(self.config.epoch_retention.max(ttl)));
        let epoch: Option<String> = self.run(invocation).await?;
        let Some(epoch) = epoch else {
            return Ok(None);
        };
        let epoch = epoch
            .parse::<u64>()
            .map_err(|e| LeaseError::Backend(format!("epoch {epoch:?} is not a u64: {e}")))?;
        Ok(Some(Lease {
            key: key.to_owned(),
            owner: Arc::from(owner),
            epoch,
        }))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, LeaseError> {
        validate(&lease.key, Some(&*lease.owner), Some(ttl))?;
        let mut invocation = self.renew.prepare_invoke();
        invocation
            .key(self.holder_key(&lease.key))
            .arg(lease.token())
            .arg(millis(ttl));
        let extended: i64 = self.run(invocation).await?;
        Ok(extended == 1)
    }

    /// One pipeline per [`RENEW_BATCH`] leases: a worker's whole set in a few round trips.
    /// `EVAL` rather than `EVALSHA`, because a pipeline cannot load a script Redis lost
    /// (after a restart) and retry; Redis caches the compiled script by its digest anyway.
    async fn renew_many(
        &self,
        leases: &[Arc<Lease>],
        ttl: Duration,
    ) -> Result<Vec<bool>, LeaseError> {
        let mut answers = Vec::with_capacity(leases.len());
        for batch in leases.chunks(RENEW_BATCH) {
            let mut pipe = redis::pipe();
            for lease in batch {
                validate(&lease.key, Some(&*lease.owner), Some(ttl))?;
                pipe.cmd("EVAL")
                    .arg(RENEW)
                    .arg(1)
                    .arg(self.holder_key(&lease.key))
                    .arg(lease.token())
                    .arg(millis(ttl));
            }
            let mut connection = self.manager.clone();
            let bound = self.config.command_timeout;
            let extended: Vec<i64> =
                match tokio::time::timeout(bound, pipe.query_async(&mut connection)).await {
                    Ok(result) => result.map_err(classify)?,
                    Err(_elapsed) => return Err(LeaseError::Timeout(bound)),
                };
            answers.extend(extended.into_iter().map(|n| n == 1));
        }
        Ok(answers)
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LeaseError> {
        validate(&lease.key, Some(&*lease.owner), None)?;
        let mut invocation = self.release.prepare_invoke();
        invocation
            .key(self.holder_key(&lease.key))
            .arg(lease.token());
        let deleted: i64 = self.run(invocation).await?;
        Ok(deleted == 1)
    }

    async fn revoke(&self, key: &str) -> Result<bool, LeaseError> {
        validate(key, None, None)?;
        let mut invocation = self.revoke.prepare_invoke();
        invocation
            .key(self.holder_key(key))
            .arg(self.channel.as_str())
            .arg(key);
        let deleted: i64 = self.run(invocation).await?;
        Ok(deleted == 1)
    }

    async fn subscribe_revocations(&self) -> Result<Revocations, LeaseError> {
        // Subscribe locally first, then wait for Redis: nothing published after the
        // listener is subscribed can fall between the two.
        let receiver = self.revoked.subscribe();
        let mut subscribed = self.subscribed.clone();
        let bound = self.config.command_timeout.max(self.config.connect_timeout);
        match tokio::time::timeout(bound, subscribed.wait_for(|s| *s)).await {
            Ok(Ok(_)) => Ok(receiver),
            Ok(Err(_closed)) => Err(LeaseError::Unavailable(
                "revocation listener has stopped".to_owned(),
            )),
            Err(_elapsed) => Err(LeaseError::Unavailable(format!(
                "not subscribed to {} within {bound:?}",
                self.channel
            ))),
        }
    }
}

/// The revocation listener: (re)subscribes until `stop`, forwarding each revoked key.
async fn listen(
    client: redis::Client,
    config: RedisLeaseConfig,
    channel: String,
    revoked: broadcast::Sender<String>,
    subscribed: watch::Sender<bool>,
    stop: CancellationToken,
) {
    let min_backoff = Duration::from_millis(20);
    let mut backoff = min_backoff;
    while !stop.is_cancelled() {
        let connect = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(channel.as_str()).await?;
            Ok::<_, RedisError>(pubsub)
        };
        let bound = config.connect_timeout + config.command_timeout;
        let attempt = tokio::select! {
            () = stop.cancelled() => break,
            attempt = tokio::time::timeout(bound, connect) => attempt,
        };
        let pubsub = match attempt {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(error)) => {
                tracing::debug!(%error, "lease revocation subscription failed; retrying");
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(config.max_resubscribe_backoff.max(min_backoff));
                continue;
            }
            Err(_elapsed) => {
                tracing::debug!("lease revocation subscription timed out; retrying");
                continue;
            }
        };
        backoff = min_backoff;
        subscribed.send_replace(true);
        let mut messages = pubsub.into_on_message();
        loop {
            let message = tokio::select! {
                () = stop.cancelled() => break,
                message = messages.next() => message,
            };
            let Some(message) = message else {
                tracing::warn!(
                    channel,
                    "lease revocation subscription lost; re-subscribing"
                );
                break;
            };
            match message.get_payload::<String>() {
                // No local subscriber is not an error.
                Ok(key) => {
                    let _ = revoked.send(key);
                }
                Err(error) => tracing::warn!(%error, "ignoring malformed revocation message"),
            }
        }
        subscribed.send_replace(false);
    }
    subscribed.send_replace(false);
}
