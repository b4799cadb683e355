//! Rebuilds the crate when a migration changes: `sqlx::migrate!` embeds the files at
//! compile time, and stable Rust cannot track them from the macro.
#![allow(
    clippy::print_stdout,
    reason = "build scripts talk to cargo through stdout"
)]

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
