//! The `agentloop` command line as a library: the commands against an orchestrator
//! ([`client`]), the replies of humans ([`humans`]), the effect ledger's listing
//! ([`effects`]), the policy authoring tools ([`policy`]), what they print ([`view`])
//! and the exit codes ([`exit`]). The binary is a thin `main.rs` over these; the
//! deployment it starts is `agentloop-stack`'s and its `bench` command is
//! `agentloop-bench`.
#![warn(missing_docs)]
#![allow(
    clippy::print_stdout,
    reason = "a command line prints its results on stdout"
)]

pub mod client;
pub mod effects;
pub mod exit;
pub mod humans;
pub mod policy;
pub mod view;
