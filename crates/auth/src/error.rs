//! The crate's two error types: a configuration that cannot be used (at start), and a
//! request that is not authenticated (per call), with its one mapping to `tonic::Status`.

use std::path::PathBuf;

use tonic::metadata::MetadataValue;

/// Why an [`AuthConfig`](crate::AuthConfig) or [`CallersConfig`](crate::CallersConfig)
/// cannot be turned into a verifier. The service must not start with it.
///
/// Messages name the configuration key and the file or URL, never a secret.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    /// The configuration breaks a rule of `validate` (the message names the key).
    #[error("{0}")]
    Invalid(String),
    /// A secret, token or JWKS file cannot be used.
    #[error("{key} {}: {problem}", path.display())]
    File {
        /// The configuration key that names the file, e.g. `auth.hs256_secret_file`.
        key: String,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: FileProblem,
    },
    /// A JWKS (file or URL) is not a JWK set, or holds no key this crate can verify with.
    #[error("{key} {location}: {problem}")]
    Jwks {
        /// `auth.jwks_file` or `auth.jwks_url`.
        key: &'static str,
        /// The file or URL (without credentials).
        location: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The JWKS URL could not be fetched (connection, timeout, HTTP status, body too large).
    #[error("cannot fetch auth.jwks_url {url}: {reason}")]
    Fetch {
        /// The URL (without credentials or query).
        url: String,
        /// Why.
        reason: String,
    },
    /// The HTTP client for the JWKS URL could not be built.
    #[error("cannot build the HTTP client for auth.jwks_url: {0}")]
    Client(String),
    /// The callers cannot be told apart: two share a name or a token, or a token is short.
    #[error("{0}")]
    Callers(String),
}

/// What is wrong with a secret, token or JWKS file.
#[derive(Debug, thiserror::Error)]
pub enum FileProblem {
    /// It cannot be opened or read.
    #[error("cannot read it: {0}")]
    Unreadable(std::io::Error),
    /// It is larger than the bound, in bytes.
    #[error("larger than {0} bytes")]
    TooLarge(u64),
    /// It is not UTF-8 text.
    #[error("not UTF-8 text")]
    NotUtf8,
    /// It holds nothing but whitespace.
    #[error("empty")]
    Empty,
    /// The secret in it is shorter than the minimum, in bytes.
    #[error("the secret is shorter than {0} bytes; use at least {0} random bytes")]
    TooShort(usize),
}

/// Why a request is not authenticated. Every variant is `UNAUTHENTICATED` on the wire.
///
/// Messages are short and fixed: they never echo the token or any claim value, so a
/// client log or an error trailer cannot leak a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `authorization` metadata.
    #[error("missing credentials: send `authorization: Bearer <token>`")]
    Missing,
    /// `authorization` is not one `Bearer <token>` entry.
    #[error("malformed authorization: expected `Bearer <token>`")]
    Malformed,
    /// The token is not valid: the reason (bad signature, expired, wrong audience, ...).
    #[error("invalid token: {0}")]
    Rejected(&'static str),
}

impl From<AuthError> for tonic::Status {
    /// `UNAUTHENTICATED`, with a `www-authenticate` challenge (RFC 6750) so HTTP-aware
    /// clients and proxies learn the scheme.
    fn from(error: AuthError) -> Self {
        let challenge = match error {
            AuthError::Missing => "Bearer",
            AuthError::Malformed => "Bearer error=\"invalid_request\"",
            AuthError::Rejected(_) => "Bearer error=\"invalid_token\"",
        };
        let mut status = tonic::Status::unauthenticated(error.to_string());
        status
            .metadata_mut()
            .insert("www-authenticate", MetadataValue::from_static(challenge));
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_auth_error_is_unauthenticated_with_a_challenge() {
        for (error, challenge) in [
            (AuthError::Missing, "Bearer"),
            (AuthError::Malformed, "Bearer error=\"invalid_request\""),
            (
                AuthError::Rejected("expired"),
                "Bearer error=\"invalid_token\"",
            ),
        ] {
            let message = error.to_string();
            let status = tonic::Status::from(error);
            assert_eq!(status.code(), tonic::Code::Unauthenticated);
            assert_eq!(status.message(), message);
            assert_eq!(
                status.metadata().get("www-authenticate").unwrap(),
                challenge
            );
        }
    }
}
