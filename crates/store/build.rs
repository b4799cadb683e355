//! Rebuilds the crate when a migration changes: `sqlx::migrate!` embeds the files at
//! compile time, and stable Rust cannot track them from the macro.
#![allow(
    clippy::print_stdout,
    reason = "build scripts talk to cargo through stdout"
)]

fn main() {
    // One line per backend's directory (cargo scans a directory recursively, but naming
    // each keeps a new backend's migrations from being forgotten here).
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=migrations/sqlite");
    println!("cargo:rerun-if-changed=migrations/postgres");
}
