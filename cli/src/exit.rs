//! Exit codes: a stable external format, one per terminal reason (docs/cli.md lists them).

use agentloop_engine::TerminalReason;

/// A command failed before or outside any invocation (unreachable server, bad input).
pub const FAILURE: u8 = 1;
/// Bad command-line usage (clap's own code).
pub const USAGE: u8 = 2;
/// `dev` was given a configuration it cannot serve: the services' code for it
/// (`agentloop_server::EXIT_BAD_CONFIG`, `EX_CONFIG`).
pub const BAD_CONFIG: u8 = 78;
/// `policy check`: the call may run once a human approves it. Below the terminal
/// reasons' 10.., so no verdict reads as an invocation's end.
pub const POLICY_REQUIRE_APPROVAL: u8 = 3;
/// `policy check`: the call may not run.
pub const POLICY_DENY: u8 = 4;
/// `watch` stopped by Ctrl-C while the invocation goes on (128 + SIGINT, as a shell
/// reports it).
pub const INTERRUPTED: u8 = 130;

/// The exit code of an invocation that ended with `reason`.
pub fn code(reason: TerminalReason) -> u8 {
    match reason {
        TerminalReason::Completed => 0,
        TerminalReason::ApprovalRequired => 10,
        TerminalReason::ClarificationRequired => 11,
        TerminalReason::Cancelled => 12,
        TerminalReason::DeadlineExceeded => 13,
        TerminalReason::MaxSteps => 14,
        TerminalReason::ToolBudgetExhausted => 15,
        TerminalReason::TokenBudgetExhausted => 16,
        TerminalReason::NoProgress => 17,
        TerminalReason::InvalidDecision => 18,
        TerminalReason::ModelError => 19,
        TerminalReason::CheckpointFailed => 20,
        TerminalReason::CannotContinue => 21,
        TerminalReason::VerificationFailed => 22,
        TerminalReason::ReconciliationRequired => 23,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_only_completed_is_zero() {
        let mut seen = std::collections::BTreeSet::new();
        for reason in TerminalReason::ALL {
            let code = code(reason);
            assert!(seen.insert(code), "{reason} shares exit code {code}");
            assert_eq!(code == 0, reason == TerminalReason::Completed);
            assert!(code != FAILURE && code != USAGE && code != BAD_CONFIG);
            assert!(code != POLICY_REQUIRE_APPROVAL && code != POLICY_DENY);
        }
        assert_eq!(i32::from(BAD_CONFIG), agentloop_server::EXIT_BAD_CONFIG);
    }
}
