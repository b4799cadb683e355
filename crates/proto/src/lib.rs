//! The gRPC contracts of agentloop, compiled to Rust.
//!
//! This crate is the one place where `proto/agentloop/v1/*.proto` becomes code:
//!
//! - module [`v1`]: the messages and enums of package `agentloop.v1`, the generated
//!   clients (feature `client`) and server traits (feature `server`);
//! - module `client` (feature `client`): the one client factory, `client::connect`,
//!   and per-service client constructors that set message size limits and timeouts
//!   in one place;
//! - module `server` (feature `server`): per-service server constructors with the
//!   same limits, so both sides of every RPC agree (they also accept gzip, which the
//!   clients do not send);
//! - [`FILE_DESCRIPTOR_SET`] for gRPC server reflection, and [`MAX_MESSAGE_BYTES`].
//!
//! It is *not* the domain model: the turn engine (`agentloop-engine`) owns the
//! vocabulary (decisions, results, terminal reasons) as plain Rust types, and
//! conversions between those and the wire types live in a mapping crate, not here.
//! Nor does it hold any service logic, storage or configuration.
//!
//! The build needs no system `protoc`: `build.rs` compiles the contracts with `protox`.

#![warn(missing_docs)]

#[cfg(feature = "client")]
pub mod client;
pub mod input;
#[cfg(feature = "server")]
pub mod server;

/// Package `agentloop.v1`: messages, enums, clients and server traits generated from
/// `proto/agentloop/v1`. The proto comments are the documentation of each item.
//
// No lint is allowed here: the generated code passes the workspace lints, and
// `missing_docs` holds because buf lint (COMMENTS) requires a comment on every
// message, field, enum value, oneof, service and rpc.
pub mod v1 {
    tonic::include_proto!("agentloop.v1");
}

/// The encoded `google.protobuf.FileDescriptorSet` of every agentloop contract and the
/// well-known types they import, with source info (comments). Register it with
/// `tonic-reflection` so tools such as `grpcurl` can discover the services.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("agentloop_descriptor");

/// Largest message, in bytes, a client or server built on these contracts sends or
/// accepts (4 MiB, gRPC's customary default, stated once so both sides agree). Tool
/// outputs larger than this must be stored elsewhere and referenced.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Most calls one `ExecuteStage` request (of the tool gateway or of an executor) may
/// carry; a larger stage is refused whole, and the orchestrator sends one call by call.
pub const MAX_STAGE_CALLS: usize = 256;

/// The answer to one call of a stage, from what `Execute` would have answered for it:
/// its result, or the status it would have failed with. The gateway and the executor
/// library both answer stages through it.
pub fn stage_answer(answered: Result<v1::ToolResult, tonic::Status>) -> v1::StageAnswer {
    use v1::stage_answer::{Answer, Refused};
    let answer = match answered {
        Ok(result) => Answer::Result(result),
        Err(status) => Answer::Refused(Refused {
            code: status.code().into(),
            message: status.message().to_owned(),
        }),
    };
    v1::StageAnswer {
        answer: Some(answer),
    }
}

/// Most reasons a verifier's answer may give; a longer answer is undecided.
pub const MAX_VERIFIER_REASONS: usize = 32;
/// Longest reason of a verifier's answer, in bytes.
pub const MAX_VERIFIER_REASON_BYTES: usize = 2 * 1024;
/// Most evidence references a verifier's answer may give.
pub const MAX_VERIFIER_EVIDENCE: usize = 64;
/// Longest evidence reference of a verifier's answer, in bytes.
pub const MAX_VERIFIER_EVIDENCE_BYTES: usize = 256;

/// Longest `grpc-message` any agentloop service answers with, in bytes.
pub const MAX_STATUS_MESSAGE_BYTES: usize = 1024;

/// `message`, cut at a character boundary to at most [`MAX_STATUS_MESSAGE_BYTES`] (the
/// cut marked with `…`). Every service's one mapping from its errors to `tonic::Status`
/// passes its message through here. Messages quote caller input (an ID, a tool name, a
/// path), so without a bound a 1 MB invocation ID came back as a 1 MB trailer, which
/// stock clients report as RESOURCE_EXHAUSTED instead of the real error.
pub fn bounded_message(message: String) -> String {
    const MARK: &str = "…";
    if message.len() <= MAX_STATUS_MESSAGE_BYTES {
        return message;
    }
    let end = prefix(&message, MAX_STATUS_MESSAGE_BYTES - MARK.len()).len();
    let mut bounded = message;
    bounded.truncate(end);
    bounded.push_str(MARK);
    bounded
}

/// The longest start of `text` of at most `max_bytes` bytes that ends at a character
/// boundary: what every message quoting untrusted text keeps of it.
pub fn prefix(text: &str, max_bytes: usize) -> &str {
    let mut end = text.len().min(max_bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// The deadline a `grpc-timeout` header value gives (gRPC's format: up to eight digits
/// and a unit), which tonic's clients and the tool gateway's in-process calls set.
pub fn grpc_timeout(value: &str) -> Option<std::time::Duration> {
    use std::time::Duration;
    let digits = value.get(..value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    match value.get(digits.len()..)? {
        "H" => Some(Duration::from_secs(amount * 3600)),
        "M" => Some(Duration::from_secs(amount * 60)),
        "S" => Some(Duration::from_secs(amount)),
        "m" => Some(Duration::from_millis(amount)),
        "u" => Some(Duration::from_micros(amount)),
        "n" => Some(Duration::from_nanos(amount)),
        _ => None,
    }
}

/// The smaller of `limit` and the time a request's `grpc-timeout` leaves: how long an
/// executor in the gateway's process may take for a call.
pub fn within_deadline(
    metadata: &tonic::metadata::MetadataMap,
    limit: std::time::Duration,
) -> std::time::Duration {
    metadata
        .get("grpc-timeout")
        .and_then(|value| value.to_str().ok())
        .and_then(grpc_timeout)
        .map_or(limit, |requested| requested.min(limit))
}

/// Test support shared by every service's tests.
#[cfg(feature = "testing")]
pub mod testing {
    /// Asserts the one mapping of a service's errors to `tonic::Status`: each error
    /// becomes its code, and the message is the error's own text.
    pub fn assert_codes<E>(cases: impl IntoIterator<Item = (E, tonic::Code)>)
    where
        E: std::fmt::Display + Into<tonic::Status>,
    {
        for (error, code) in cases {
            let text = error.to_string();
            let status: tonic::Status = error.into();
            assert_eq!(status.code(), code, "{text}");
            assert_eq!(status.message(), text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_messages_are_cut_at_a_character_boundary() {
        assert_eq!(bounded_message("short".to_owned()), "short");
        let exact = "a".repeat(MAX_STATUS_MESSAGE_BYTES);
        assert_eq!(bounded_message(exact.clone()), exact);
        // Multi-byte characters across the cut: never half a character.
        let long = format!("invalid ID {:?}", "é".repeat(1_000_000));
        let bounded = bounded_message(long.clone());
        assert!(
            bounded.len() <= MAX_STATUS_MESSAGE_BYTES,
            "{}",
            bounded.len()
        );
        assert!(bounded.ends_with('…'));
        assert!(long.starts_with(bounded.trim_end_matches('…')));
    }
}
