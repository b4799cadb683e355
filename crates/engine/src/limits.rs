//! Budgets and bounds of one invocation.

use std::num::NonZeroU32;

use serde::{Deserialize, Serialize};

use crate::decision::DecisionBounds;
use crate::money::MicroUsd;
use crate::time::UnixMillis;

/// The default bound on a wait for a human: a week.
pub const DEFAULT_MAX_WAIT_MS: u64 = 7 * 24 * 3600 * 1000;

/// What one invocation may use. Checked by the engine on committed state; none of them
/// can be raised by the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Most model decisions (turns).
    pub max_steps: u32,
    /// Most tool calls executed, over all turns.
    pub max_tool_calls: u32,
    /// Most tokens (input + output); `None` for no token budget.
    pub max_tokens: Option<u64>,
    /// Most money spent on decisions; `None` for no cost budget. With one, a decision that
    /// comes without a cost (its model has no price) ends the invocation: an unpriced
    /// model must not make a budget silently unlimited.
    #[serde(rename = "max_cost_micro_usd")]
    pub max_cost: Option<MicroUsd>,
    /// How many times in a row the same plan may execute; `None` turns repeat detection off.
    pub max_repeated_plan: Option<NonZeroU32>,
    /// When the invocation must stop, if ever. Time spent waiting for a human is added
    /// to it, unless `wait_counts_toward_deadline`.
    pub deadline: Option<UnixMillis>,
    /// Longest wait for a human (an approval, an answer), in milliseconds; past it the
    /// invocation ends `deadline_exceeded`.
    pub max_wait_ms: u64,
    /// Whether waiting for a human uses up the `deadline` too.
    pub wait_counts_toward_deadline: bool,
    /// Invalid decisions fed back to the model before `invalid_decision`.
    pub decision_repairs: u32,
    /// Rejected final answers fed back to the model before `verification_failed`.
    pub verification_repairs: u32,
    /// Bounds on a single decision.
    pub bounds: DecisionBounds,
}

impl Default for Limits {
    /// Conservative defaults: a profile raises them deliberately.
    fn default() -> Self {
        Limits {
            max_steps: 16,
            max_tool_calls: 64,
            max_tokens: None,
            max_cost: None,
            max_repeated_plan: NonZeroU32::new(2),
            deadline: None,
            max_wait_ms: DEFAULT_MAX_WAIT_MS,
            wait_counts_toward_deadline: false,
            decision_repairs: 0,
            verification_repairs: 1,
            bounds: DecisionBounds::default(),
        }
    }
}
