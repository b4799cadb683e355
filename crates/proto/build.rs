//! Generates the Rust code for `proto/agentloop/v1/*.proto` without a system `protoc`:
//! `protox` (a pure-Rust protobuf compiler) parses the files into a descriptor set,
//! `tonic-prost-build` generates messages, clients and servers from it, and the encoded
//! descriptor set is written to `OUT_DIR` for gRPC server reflection.

use std::env;
use std::error::Error;
use std::fs;
use std::path::PathBuf;

/// The protobuf include root, relative to this crate.
const PROTO_ROOT: &str = "../../proto";
/// The directory holding the contract files, relative to this crate.
const PROTO_DIR: &str = "../../proto/agentloop/v1";

fn main() -> Result<(), Box<dyn Error>> {
    // Re-run when a contract is added, removed or edited (the directory entry covers
    // additions and removals, the file entries cover edits).
    println!("cargo:rerun-if-changed={PROTO_DIR}");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={PROTO_ROOT}/google");

    let mut files = Vec::new();
    for entry in fs::read_dir(PROTO_DIR)? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "proto") {
            println!("cargo:rerun-if-changed={}", path.display());
            files.push(path);
        }
    }
    // Deterministic order, so the generated code and descriptor set do not depend on
    // the file system's listing order.
    files.sort();

    let mut compiler = protox::Compiler::new([PROTO_ROOT])?;
    // Source info carries the proto comments into the generated Rust docs and into
    // the reflection descriptor; imports make the set self-contained (well-known types).
    compiler.include_source_info(true).include_imports(true);
    compiler.open_files(&files)?;

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out_dir.join("agentloop_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    // Cargo sets CARGO_FEATURE_<NAME> for every enabled feature of this crate.
    let client = env::var_os("CARGO_FEATURE_CLIENT").is_some();
    let server = env::var_os("CARGO_FEATURE_SERVER").is_some();

    tonic_prost_build::configure()
        .build_client(client)
        .build_server(server)
        .out_dir(&out_dir)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
