//! The `agentloop` command line as a library: the embedded deployment ([`embedded`]),
//! the commands against an orchestrator ([`client`]), what they print ([`view`]) and the
//! exit codes ([`exit`]). The binary is a thin `main.rs` over these, and the end-to-end
//! tests and benchmarks start the same embedded stack.
#![warn(missing_docs)]
#![allow(
    clippy::print_stdout,
    reason = "a command line prints its results on stdout"
)]

pub mod bench;
pub mod client;
pub mod effects;
pub mod embedded;
pub mod exit;
pub mod view;
