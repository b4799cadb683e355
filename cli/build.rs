//! Links the functions a run executes first in the release binary's code, in the order of
//! `symbol-order.txt` (written by `bench/order-symbols`).
//!
//! The kernel maps a binary's code into a process 64 KiB at a time around each page it
//! touches. Scattered over 38 MB, the code one `agentloop bench` runs made 19-22 MiB of
//! its resident set; packed together, about 5 MiB (docs/performance.md, "The binary's
//! pages").
//!
//! Only where the linker is known to be LLD, which reads the file: a release build for
//! x86-64 Linux with Rust's own linker settings. A name the binary lacks (the file is
//! older than a dependency) is skipped, so a stale file costs locality, never a build.

use std::env;
use std::path::Path;

fn main() {
    let order =
        Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join("symbol-order.txt");
    println!("cargo:rerun-if-changed={}", order.display());
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let release = env::var("PROFILE").is_ok_and(|profile| profile == "release");
    let lld = env::var("TARGET").is_ok_and(|target| target == "x86_64-unknown-linux-gnu")
        // Rust links with its own LLD there unless told otherwise: a linker of the user's
        // choice may not know the option.
        && env::var_os("RUSTC_LINKER").is_none()
        && !env::var("CARGO_ENCODED_RUSTFLAGS").is_ok_and(|flags| {
            flags.split('\x1f').any(|flag| {
                ["linker", "link-self-contained", "fuse-ld"]
                    .iter()
                    .any(|setting| flag.contains(setting))
            })
        });
    if release && lld && order.is_file() {
        println!(
            "cargo:rustc-link-arg-bin=agentloop=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bin=agentloop=-Wl,--no-warn-symbol-ordering");
    }
}
