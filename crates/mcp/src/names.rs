//! Tool names as models see them: `<server>__<tool>`.
//!
//! Model APIs accept function names of `[a-zA-Z0-9_-]` up to 64 bytes. MCP tool names
//! may hold more (dots, slashes, up to 128 characters), so a name is mapped only when it
//! fits as it is: a lossy mapping (dots to underscores, say) would let two tools meet
//! under one name and would need a table to map calls back.

/// Longest name a model API accepts for a function, in bytes.
pub const MAX_TOOL_NAME_BYTES: usize = 64;

/// The separator between the server's name and the tool's.
const SEPARATOR: &str = "__";

/// Whether `text` only has characters of `[a-zA-Z0-9_-]`.
pub(crate) fn valid_chars(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `tool` can be the tool part of a name: 1 to 61 characters of
/// `[a-zA-Z0-9_-]` (the shortest server name and the separator take the other three).
pub(crate) fn valid_tool_part(tool: &str) -> bool {
    !tool.is_empty() && tool.len() <= MAX_TOOL_NAME_BYTES - 1 - SEPARATOR.len() && valid_chars(tool)
}

/// The name the gateway registers `tool` of `server` under, or `None` when it does not
/// fit a model's function name.
pub(crate) fn qualified(server: &str, tool: &str) -> Option<String> {
    let name = format!("{server}{SEPARATOR}{tool}");
    (valid_tool_part(tool) && name.len() <= MAX_TOOL_NAME_BYTES).then_some(name)
}

/// The server's own name of `name`, when `name` is one of `server`'s tools.
pub(crate) fn local<'a>(server: &str, name: &'a str) -> Option<&'a str> {
    name.strip_prefix(server)?
        .strip_prefix(SEPARATOR)
        .filter(|tool| !tool.is_empty())
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn names_map_both_ways() {
        assert_eq!(
            qualified("time", "get_current_time").unwrap(),
            "time__get_current_time"
        );
        assert_eq!(
            local("time", "time__get_current_time"),
            Some("get_current_time")
        );
        // A tool whose own name starts with an underscore keeps it.
        assert_eq!(local("a", "a___b"), Some("_b"));
        assert_eq!(local("time", "time__"), None);
        assert_eq!(local("time", "times__x"), None);
        assert_eq!(local("time", "other__x"), None);
    }

    #[test]
    fn names_a_model_would_refuse_are_not_mapped() {
        for tool in ["", "a.b", "a/b", "with space", "é", &"x".repeat(60)] {
            assert_eq!(qualified("time", tool), None, "{tool:?}");
        }
        let longest = "x".repeat(MAX_TOOL_NAME_BYTES - "time__".len());
        assert_eq!(
            qualified("time", &longest).unwrap().len(),
            MAX_TOOL_NAME_BYTES
        );
        assert_eq!(qualified("time", &format!("{longest}x")), None);
    }
}
