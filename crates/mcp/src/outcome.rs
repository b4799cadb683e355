//! How a `tools/call` answer becomes the call's result, as pure functions.
//!
//! - A result with `isError: true` is a tool failure the model sees: the call was
//!   understood and answered, so it is a `REJECTED` [`ToolError`] with the tool's text.
//! - A JSON-RPC error is the server refusing the request itself (an unknown tool,
//!   arguments that break the schema): a definite answer, so a [`ToolError`] too.
//! - Any other result is the output: `structuredContent` when present, else the joined
//!   text when every block is text, else the content blocks as JSON.
//!
//! Failures without an answer are not here: they are `tonic::Status`es
//! ([`crate::error::ExecutorError`]), so the gateway decides by the tool's class.

use agentloop_proto::v1::tool_result::{InputRequired, Outcome};
use agentloop_proto::v1::{ErrorType, NextAction, ToolError, ToolOutput};
use rmcp::model::{CallToolResult, ContentBlock, ErrorCode, ErrorData};

/// Largest output kept, in bytes of JSON text; a larger result is replaced.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// Longest error message given to the model, in bytes.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 16 * 1024;

/// The outcome of a call the server answered with a result. `writes` says whether the
/// call may have changed something (it carried an effect key).
pub(crate) fn answered(server: &str, result: CallToolResult, writes: bool) -> Outcome {
    if result.is_error == Some(true) {
        let text = joined_text(&result.content);
        let message = if text.is_empty() {
            format!("the tool of MCP server {server:?} failed without saying why")
        } else {
            text
        };
        return error(ErrorType::Rejected, message, false, NextAction::None);
    }
    let encoded = match (&result.structured_content, all_text(&result.content)) {
        (Some(structured), _) => serde_json::to_string(structured),
        (None, true) => serde_json::to_string(&joined_text(&result.content)),
        (None, false) => serde_json::to_string(&result.content),
    };
    let output_json = match encoded {
        Ok(json) => json,
        // Values that came from JSON encode again; this is belt and braces.
        Err(e) => {
            return error(
                ErrorType::Internal,
                format!("the result of MCP server {server:?} cannot be encoded: {e}"),
                false,
                NextAction::None,
            );
        }
    };
    if output_json.len() <= MAX_OUTPUT_BYTES {
        return Outcome::Output(ToolOutput {
            output_json,
            receipt: String::new(),
        });
    }
    let bytes = output_json.len();
    if writes {
        // The call succeeded, so a write was applied: an error here would be recorded
        // as "not applied" in the effect ledger. The output says what happened instead.
        let note = serde_json::json!({
            "error": "output_too_large",
            "detail": format!(
                "the call succeeded, but its output of {bytes} bytes is larger than \
                 {MAX_OUTPUT_BYTES} and was not kept"
            ),
        });
        return Outcome::Output(ToolOutput {
            output_json: note.to_string(),
            receipt: String::new(),
        });
    }
    error(
        ErrorType::Internal,
        format!(
            "the output of MCP server {server:?} is {bytes} bytes, larger than \
             {MAX_OUTPUT_BYTES}; ask for less"
        ),
        false,
        NextAction::FixArguments,
    )
}

/// The outcome of a call the server refused with a JSON-RPC error.
pub(crate) fn refused(server: &str, refusal: &ErrorData) -> Outcome {
    let message = format!(
        "MCP server {server:?} refused the call: {}",
        agentloop_proto::prefix(&refusal.message, MAX_ERROR_MESSAGE_BYTES)
    );
    match refusal.code {
        ErrorCode::INVALID_PARAMS => error(
            ErrorType::InvalidArguments,
            message,
            false,
            NextAction::FixArguments,
        ),
        ErrorCode::METHOD_NOT_FOUND => error(ErrorType::Internal, message, false, NextAction::Stop),
        _ => error(ErrorType::Internal, message, false, NextAction::None),
    }
}

/// The outcome of a call that was never sent because the server is not reachable: it
/// had no effect, so it may be sent again as it is.
pub(crate) fn not_sent(message: String) -> Outcome {
    error(ErrorType::Unavailable, message, true, NextAction::Retry)
}

/// The outcome of a call refused before anything was sent, for arguments that cannot be.
pub(crate) fn invalid_arguments(message: String) -> Outcome {
    error(
        ErrorType::InvalidArguments,
        message,
        false,
        NextAction::FixArguments,
    )
}

/// The outcome of a call whose server asked a person `message`: it waits for the answer
/// (the server was answered `cancel`).
pub(crate) fn input_required(message: String, schema_json: String) -> Outcome {
    Outcome::InputRequired(InputRequired {
        message,
        requested_schema_json: schema_json,
    })
}

/// The outcome of a call whose server asked a question the call cannot wait for (the
/// server was answered `cancel`).
pub(crate) fn unanswerable(message: String) -> Outcome {
    error(ErrorType::Rejected, message, false, NextAction::None)
}

fn error(error_type: ErrorType, message: String, retryable: bool, next: NextAction) -> Outcome {
    Outcome::Error(ToolError {
        error_type: error_type as i32,
        message: agentloop_proto::prefix(&message, MAX_ERROR_MESSAGE_BYTES).to_owned(),
        retryable,
        next_allowed_action: next as i32,
    })
}

fn all_text(content: &[ContentBlock]) -> bool {
    content.iter().all(|block| block.as_text().is_some())
}

/// The text blocks of `content`, one per line.
fn joined_text(content: &[ContentBlock]) -> String {
    let texts: Vec<&str> = content
        .iter()
        .filter_map(|block| block.as_text().map(|text| text.text.as_str()))
        .collect();
    texts.join("\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::wildcard_enum_match_arm)]

    use super::*;

    fn output(outcome: Outcome) -> String {
        match outcome {
            Outcome::Output(output) => output.output_json,
            other => panic!("expected an output, got {other:?}"),
        }
    }

    fn tool_error(outcome: Outcome) -> ToolError {
        match outcome {
            Outcome::Error(error) => error,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn structured_content_wins_then_text_then_the_blocks() {
        let mut result = CallToolResult::success(vec![ContentBlock::text("{\"a\": 1}")]);
        result.structured_content = Some(serde_json::json!({"a": 1}));
        assert_eq!(output(answered("s", result, false)), r#"{"a":1}"#);
        let text =
            CallToolResult::success(vec![ContentBlock::text("one"), ContentBlock::text("two")]);
        assert_eq!(output(answered("s", text, false)), r#""one\ntwo""#);
        let mixed = CallToolResult::success(vec![
            ContentBlock::text("see"),
            ContentBlock::image("AAAA", "image/png"),
        ]);
        let blocks: serde_json::Value =
            serde_json::from_str(&output(answered("s", mixed, false))).unwrap();
        assert_eq!(blocks[0]["type"], "text");
        assert_eq!(blocks[1]["type"], "image");
        assert_eq!(blocks[1]["mimeType"], "image/png");
        let empty = CallToolResult::success(vec![]);
        assert_eq!(output(answered("s", empty, false)), r#""""#);
    }

    #[test]
    fn an_is_error_result_is_a_rejection_the_model_reads() {
        let failed = CallToolResult::error(vec![ContentBlock::text("Invalid timezone 'X'")]);
        let e = tool_error(answered("time", failed, true));
        assert_eq!(e.error_type, ErrorType::Rejected as i32);
        assert_eq!(e.message, "Invalid timezone 'X'");
        assert!(!e.retryable);
        let silent = CallToolResult::error(vec![]);
        assert!(
            tool_error(answered("time", silent, false))
                .message
                .contains("\"time\"")
        );
    }

    #[test]
    fn an_oversized_output_is_an_error_for_a_read_and_a_note_for_a_write() {
        let big =
            || CallToolResult::success(vec![ContentBlock::text("x".repeat(MAX_OUTPUT_BYTES))]);
        let e = tool_error(answered("s", big(), false));
        assert_eq!(e.error_type, ErrorType::Internal as i32);
        assert!(e.message.contains("larger than"), "{}", e.message);
        let note: serde_json::Value =
            serde_json::from_str(&output(answered("s", big(), true))).unwrap();
        assert_eq!(note["error"], "output_too_large");
    }

    #[test]
    fn json_rpc_errors_are_definite_refusals() {
        let invalid = ErrorData::invalid_params("Unknown tool: nope", None);
        let e = tool_error(refused("s", &invalid));
        assert_eq!(e.error_type, ErrorType::InvalidArguments as i32);
        assert_eq!(e.next_allowed_action, NextAction::FixArguments as i32);
        let internal = ErrorData::internal_error("boom", None);
        let e = tool_error(refused("s", &internal));
        assert_eq!(e.error_type, ErrorType::Internal as i32);
        assert!(e.message.contains("boom"));
        let huge = ErrorData::internal_error("é".repeat(MAX_ERROR_MESSAGE_BYTES), None);
        assert!(tool_error(refused("s", &huge)).message.len() <= MAX_ERROR_MESSAGE_BYTES);
    }

    #[test]
    fn a_call_not_sent_may_be_sent_again() {
        let e = tool_error(not_sent("down".to_owned()));
        assert_eq!(
            (e.error_type, e.retryable, e.next_allowed_action),
            (
                ErrorType::Unavailable as i32,
                true,
                NextAction::Retry as i32
            )
        );
    }
}
