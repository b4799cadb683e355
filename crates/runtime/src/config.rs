//! The runtime's settings: budgets, bounds, fair use per tenant and how invocations are
//! shared between processes. They are sections of the orchestrator's configuration file
//! (`[limits]`, `[bounds]`, `[tenants]`, `[workers]`), layered as it is.

use std::num::NonZeroU32;

use agentloop_engine::{DecisionBounds, Limits, MicroUsd, UnixMillis};
use serde::{Deserialize, Serialize};

/// What a runtime reads of its configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// The default profile's budgets, and the runtime's timings.
    pub limits: LimitsConfig,
    /// Bounds on requests, and on the invocations run at once.
    pub bounds: RequestBounds,
    /// Fair use per tenant.
    pub tenants: TenantLimits,
}

/// Fair use per tenant: so that one tenant cannot fill the cluster for the others. Both
/// bounds hold across every orchestrator that shares the Redis of `workers.redis_url`,
/// and per process without it; 0 turns a bound off (the default: a deployment sets them
/// to its tenants' sizes). A start over a bound is RESOURCE_EXHAUSTED, names the bound,
/// and stores nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantLimits {
    /// Invocations one tenant may have running at once.
    pub max_running: usize,
    /// Starts one tenant may make per second, on average.
    pub starts_per_s: u32,
    /// Starts one tenant may make at once after a quiet spell (the token bucket's size);
    /// 0 for `starts_per_s`.
    pub start_burst: u32,
}

/// Budgets of the default profile; `StartInvocation` may override them per invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Most turns.
    pub max_steps: u32,
    /// Most tool calls.
    pub max_tool_calls: u32,
    /// Most tokens; unset for none.
    pub max_tokens: Option<u64>,
    /// Most money the model calls may cost, in millionths of a US dollar; unset for none.
    /// It needs priced models (the decision service's `prices`): an unpriced decision
    /// under a cost budget ends the invocation with `model_error`.
    pub max_cost_micro_usd: Option<u64>,
    /// Times in a row the same plan may run; 0 turns the repeat check off.
    pub max_repeated_plan: u32,
    /// Wall-clock budget in milliseconds; unset for none.
    pub deadline_ms: Option<u64>,
    /// Longest wait for a human (an approval, an answer), in milliseconds; past it the
    /// invocation ends `deadline_exceeded`.
    pub max_wait_ms: u64,
    /// Whether time spent waiting for a human uses up `deadline_ms` too (by default the
    /// deadline moves on by the time waited).
    pub wait_counts_toward_deadline: bool,
    /// How often this orchestrator looks for waits past their bound, in milliseconds.
    pub wait_sweep_ms: u64,
    /// Invalid decisions fed back to the model before `invalid_decision`.
    pub decision_repairs: u32,
    /// Rejected answers fed back to the model before `verification_failed`.
    pub verification_repairs: u32,
    /// Timeout of one tool call when its descriptor names none, in milliseconds.
    pub tool_timeout_ms: u64,
    /// On shutdown, how long running tool calls may go on before they are cancelled (their
    /// turn is still committed, and the invocation resumes on the next start).
    pub drain_timeout_ms: u64,
    /// How often the tool gateway's tools are listed again, in milliseconds, so tools
    /// whose executors register, change, go away or come back are followed without a
    /// restart (and the model is told which are unavailable); 0 lists them once.
    pub tools_refresh_ms: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let engine = Limits::default();
        LimitsConfig {
            max_steps: engine.max_steps,
            max_tool_calls: engine.max_tool_calls,
            max_tokens: engine.max_tokens,
            max_cost_micro_usd: engine.max_cost.map(|max| max.0),
            max_repeated_plan: engine.max_repeated_plan.map_or(0, NonZeroU32::get),
            deadline_ms: None,
            max_wait_ms: engine.max_wait_ms,
            wait_counts_toward_deadline: engine.wait_counts_toward_deadline,
            wait_sweep_ms: 1_000,
            decision_repairs: engine.decision_repairs,
            verification_repairs: engine.verification_repairs,
            tool_timeout_ms: 30_000,
            drain_timeout_ms: 10_000,
            tools_refresh_ms: 2_000,
        }
    }
}

impl LimitsConfig {
    /// The engine limits of an invocation started at `started`.
    pub fn limits(&self, started: UnixMillis) -> Limits {
        Limits {
            max_steps: self.max_steps,
            max_tool_calls: self.max_tool_calls,
            max_tokens: self.max_tokens,
            max_cost: self.max_cost_micro_usd.map(MicroUsd),
            max_repeated_plan: NonZeroU32::new(self.max_repeated_plan),
            deadline: self.deadline_ms.map(|ms| started.saturating_add(ms)),
            max_wait_ms: self.max_wait_ms,
            wait_counts_toward_deadline: self.wait_counts_toward_deadline,
            decision_repairs: self.decision_repairs,
            verification_repairs: self.verification_repairs,
            bounds: DecisionBounds::default(),
        }
    }
}

/// Worker leases: each running invocation is run by the one orchestrator process that holds
/// its lease.
///
/// The TTL bounds how long an invocation waits after its worker dies (kill -9, power, a
/// partition) before another takes it over: takeover comes at most `lease_ttl_ms +
/// sweep_every_ms` after the last renewal. Renewals run every third of the TTL, so one
/// renewal may fail (a Redis failover, a long pause) without the lease lapsing. 10 s keeps
/// a dead worker's invocations waiting about 10 s while tolerating multi-second Redis or
/// scheduler hiccups without handing live work over; lower it where faster takeover
/// matters more than tolerance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkersConfig {
    /// The Redis shared by the orchestrator processes (`redis://host:port/db`); unset for
    /// in-process leases (one orchestrator process, the embedded default).
    pub redis_url: Option<String>,
    /// This worker's name in leases; unset for a fresh random one per process start.
    pub worker_id: Option<String>,
    /// Lease time-to-live, in milliseconds.
    pub lease_ttl_ms: u64,
    /// How often the store is swept for running invocations nobody holds, in milliseconds
    /// (only with `redis_url`: a lone process orphans nothing while it lives).
    pub sweep_every_ms: u64,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        WorkersConfig {
            redis_url: None,
            worker_id: None,
            lease_ttl_ms: 10_000,
            sweep_every_ms: 2_000,
        }
    }
}

/// Bounds on what callers may send; over a bound is INVALID_ARGUMENT, nothing stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestBounds {
    /// Largest goal, in bytes.
    pub max_goal_bytes: usize,
    /// Largest scripted-model file, in bytes.
    pub max_script_bytes: usize,
    /// Largest idempotency key, actor, tenant or reason, in bytes.
    pub max_key_bytes: usize,
    /// Invocations this orchestrator runs at once.
    pub max_running: usize,
    /// Highest `max_steps` a caller may ask for.
    pub max_steps_cap: u32,
    /// Highest `max_tool_calls` a caller may ask for.
    pub max_tool_calls_cap: u32,
    /// Longest deadline a caller may ask for, in milliseconds.
    pub max_deadline_ms: u64,
    /// Longest wait for a human a caller may ask for (`max_wait`), in milliseconds.
    pub max_wait_cap_ms: u64,
    /// Largest answer to a clarification, or comment on an approval, in bytes.
    pub max_reply_bytes: usize,
}

impl Default for RequestBounds {
    fn default() -> Self {
        RequestBounds {
            max_goal_bytes: 64 * 1024,
            max_script_bytes: 1024 * 1024,
            max_key_bytes: 256,
            max_running: 10_000,
            max_steps_cap: 10_000,
            max_tool_calls_cap: 100_000,
            max_deadline_ms: 7 * 24 * 3600 * 1000,
            max_wait_cap_ms: 30 * 24 * 3600 * 1000,
            max_reply_bytes: 16 * 1024,
        }
    }
}
