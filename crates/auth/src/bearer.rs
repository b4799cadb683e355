//! `authorization: Bearer <token>`: the one parser, shared by JWTs and service tokens.

use tonic::metadata::MetadataMap;

use crate::AuthError;

/// Longest token accepted, in bytes (8 KiB). Checked before any parsing or hashing, so an
/// oversized header costs a length comparison; real JWTs are well under 2 KiB.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// The token of the one `authorization` entry of `metadata`.
///
/// The scheme is case-insensitive (RFC 7235); two `authorization` entries are refused as
/// malformed, since which one a proxy or a later layer would read is not defined.
pub(crate) fn bearer_token(metadata: &MetadataMap) -> Result<&str, AuthError> {
    let mut values = metadata.get_all("authorization").iter();
    let Some(value) = values.next() else {
        return Err(AuthError::Missing);
    };
    if values.next().is_some() {
        return Err(AuthError::Malformed);
    }
    if value.as_encoded_bytes().len() > MAX_TOKEN_BYTES + "Bearer ".len() {
        return Err(AuthError::Rejected("token too large"));
    }
    let text = value.to_str().map_err(|_| AuthError::Malformed)?;
    let (scheme, token) = text.split_once(' ').ok_or(AuthError::Malformed)?;
    let token = token.trim_matches(' ');
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(AuthError::Malformed);
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(values: &[&str]) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        for value in values {
            metadata.append("authorization", value.parse().unwrap());
        }
        metadata
    }

    #[test]
    fn parses_bearer() {
        assert_eq!(bearer_token(&with(&["Bearer abc"])), Ok("abc"));
        assert_eq!(bearer_token(&with(&["bearer  abc "])), Ok("abc"));
        assert_eq!(bearer_token(&with(&["BEARER abc"])), Ok("abc"));
    }

    #[test]
    fn refuses_everything_else() {
        assert_eq!(bearer_token(&MetadataMap::new()), Err(AuthError::Missing));
        for bad in [
            "Basic abc",
            "Bearer",
            "Bearer ",
            "Bearer    ",
            "abc",
            "Bearerabc",
        ] {
            assert_eq!(
                bearer_token(&with(&[bad])),
                Err(AuthError::Malformed),
                "{bad:?}"
            );
        }
        assert_eq!(
            bearer_token(&with(&["Bearer a", "Bearer b"])),
            Err(AuthError::Malformed)
        );
        let huge = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1));
        assert_eq!(
            bearer_token(&with(&[&huge])),
            Err(AuthError::Rejected("token too large"))
        );
    }
}
