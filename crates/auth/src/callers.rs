//! [`Callers`]: the internal callers a service accepts (service to service), by service
//! token or by client certificate.
//!
//! Each callee lists the callers it accepts, each with a name and a token file, a SPIFFE
//! ID, or both. A token is an opaque random secret, so there is nothing to verify but
//! equality: the presented token is compared with every caller's in time that depends on
//! the lengths alone (which the presenter knows), never on where the bytes differ, and
//! every caller is compared, so timing does not tell which one matched. (Hashing both
//! sides first would hide the lengths too, but it was most of a guarded call's cost:
//! `agentloop bench --mode distributed` spent 2.5% of its instructions in SHA-256.)
//!
//! A certificate was verified by the TLS handshake against the service's client CA; what
//! is left is to read who it names: its URI SANs ([`uri_sans`]), matched against the
//! callers' SPIFFE IDs.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tonic::metadata::MetadataMap;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::bearer::bearer_token;
use crate::identity::is_valid_identity;
use crate::secret::read_secret_at_least;
use crate::{AuthConfigError, AuthError};

/// Shortest service token, in bytes: 32 random bytes, or their 43-character base64.
const MIN_TOKEN_BYTES: usize = 32;

/// The callers a service accepts. Empty (the default) means no check.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CallersConfig {
    /// One entry per accepted caller.
    pub callers: Vec<CallerConfig>,
}

/// One accepted internal caller: by a token, by a client certificate, or either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallerConfig {
    /// The caller's name, as requests are attributed to it (e.g. `orchestrator`).
    pub name: String,
    /// A file holding the caller's token (at least 32 bytes, whitespace trimmed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The URI SAN of the caller's client certificate, a SPIFFE ID such as
    /// `spiffe://cluster.local/ns/agentloop/sa/orchestrator`, for a service that serves
    /// mTLS (`server_tls` with a `client_ca_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spiffe_id: Option<String>,
}

impl CallersConfig {
    /// Whether callers must present a service token (the list is not empty).
    pub fn is_on(&self) -> bool {
        !self.callers.is_empty()
    }

    /// Checks the rules that need no I/O: every name valid (1 to 128 bytes of
    /// `[A-Za-z0-9._:@/+=-]`) and listed once, each caller with a token file or a SPIFFE
    /// ID (`spiffe://` or another URI), no SPIFFE ID listed twice.
    pub fn validate(&self) -> Result<(), String> {
        let mut names = HashSet::new();
        let mut ids = HashSet::new();
        for (i, caller) in self.callers.iter().enumerate() {
            if !is_valid_identity(&caller.name) {
                return Err(format!(
                    "callers[{i}].name must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ / + = -"
                ));
            }
            if !names.insert(caller.name.as_str()) {
                return Err(format!(
                    "callers[{i}].name {:?} is listed more than once",
                    caller.name
                ));
            }
            match (&caller.token_file, &caller.spiffe_id) {
                (None, None) => {
                    return Err(format!("callers[{i}] needs a token_file or a spiffe_id"));
                }
                (Some(file), _) if file.as_os_str().is_empty() => {
                    return Err(format!("callers[{i}].token_file must not be empty"));
                }
                (_, Some(id)) if !is_uri(id) => {
                    return Err(format!(
                        "callers[{i}].spiffe_id must be a URI such as spiffe://domain/path"
                    ));
                }
                (_, Some(id)) if !ids.insert(id.as_str()) => {
                    return Err(format!(
                        "callers[{i}].spiffe_id {id:?} is listed more than once"
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// The accepted internal callers, ready to check requests. Cloning is cheap (one `Arc`).
#[derive(Clone)]
pub struct Callers {
    entries: Arc<[Entry]>,
}

struct Entry {
    name: String,
    /// The token; `None` for a caller known by its certificate only.
    token: Option<Box<[u8]>>,
    spiffe_id: Option<String>,
}

impl std::fmt::Debug for Callers {
    /// Names only: the tokens stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callers")
            .field(
                "names",
                &self.entries.iter().map(|e| &e.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Callers {
    /// `None` when no caller is listed. Otherwise reads every token file (trimmed, at least
    /// 32 bytes); two callers with the same name or the same token are refused.
    pub fn from_config(config: &CallersConfig) -> Result<Option<Callers>, AuthConfigError> {
        config.validate().map_err(AuthConfigError::Invalid)?;
        if !config.is_on() {
            return Ok(None);
        }
        let mut entries = Vec::with_capacity(config.callers.len());
        for (i, caller) in config.callers.iter().enumerate() {
            let token = match &caller.token_file {
                Some(path) => {
                    let key = format!("callers[{i}].token_file");
                    Some(read_secret_at_least(&key, path, MIN_TOKEN_BYTES)?)
                }
                None => None,
            };
            entries.push((caller.name.clone(), token, caller.spiffe_id.clone()));
        }
        Callers::from_entries(entries).map(Some)
    }

    /// Callers from `(name, token)` pairs, for in-process wiring and tests. The same rules
    /// as [`Callers::from_config`]: at least one caller, valid and distinct names, distinct
    /// tokens of at least 32 bytes.
    pub fn from_tokens(
        callers: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Callers, AuthConfigError> {
        Callers::from_entries(
            callers
                .into_iter()
                .map(|(name, token)| (name, Some(token), None)),
        )
    }

    /// Callers from `(name, token, SPIFFE ID)`, each with at least one of the two.
    fn from_entries(
        callers: impl IntoIterator<Item = (String, Option<String>, Option<String>)>,
    ) -> Result<Callers, AuthConfigError> {
        let mut entries: Vec<Entry> = Vec::new();
        for (name, token, spiffe_id) in callers {
            if !is_valid_identity(&name) {
                return Err(AuthConfigError::Callers(format!(
                    "caller name {name:?} must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ / + = -"
                )));
            }
            if token.is_none() && spiffe_id.is_none() {
                return Err(AuthConfigError::Callers(format!(
                    "caller {name:?} has neither a token nor a SPIFFE ID"
                )));
            }
            if let Some(token) = &token
                && token.len() < MIN_TOKEN_BYTES
            {
                return Err(AuthConfigError::Callers(format!(
                    "the token of caller {name:?} is shorter than {MIN_TOKEN_BYTES} bytes"
                )));
            }
            let token: Option<Box<[u8]>> = token.map(|token| token.into_bytes().into());
            for entry in &entries {
                if entry.name == name {
                    return Err(AuthConfigError::Callers(format!(
                        "caller {name:?} is listed more than once"
                    )));
                }
                if token.is_some() && entry.token == token {
                    return Err(AuthConfigError::Callers(format!(
                        "callers {:?} and {name:?} have the same token; give each caller its own",
                        entry.name
                    )));
                }
                if spiffe_id.is_some() && entry.spiffe_id == spiffe_id {
                    return Err(AuthConfigError::Callers(format!(
                        "callers {:?} and {name:?} have the same SPIFFE ID",
                        entry.name
                    )));
                }
            }
            entries.push(Entry {
                name,
                token,
                spiffe_id,
            });
        }
        if entries.is_empty() {
            return Err(AuthConfigError::Callers("no callers given".to_owned()));
        }
        Ok(Callers {
            entries: entries.into(),
        })
    }

    /// The name of the caller whose token `authorization: Bearer <token>` carries.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<String, AuthError> {
        let presented = bearer_token(metadata)?.as_bytes();
        let mut matched = None;
        for entry in self.entries.iter() {
            if let Some(token) = &entry.token
                && constant_time_eq(token, presented)
            {
                matched = Some(entry);
            }
        }
        matched
            .map(|entry| entry.name.clone())
            .ok_or(AuthError::Rejected("unknown service token"))
    }

    /// The name of the caller whose SPIFFE ID the verified client certificate `leaf`
    /// (DER) names among its URI SANs; `None` when it names none of them (or does not
    /// parse, which a certificate the handshake verified cannot do).
    pub fn authenticate_certificate(&self, leaf: &[u8]) -> Option<String> {
        let sans = uri_sans(leaf);
        self.entries
            .iter()
            .find(|entry| {
                entry
                    .spiffe_id
                    .as_ref()
                    .is_some_and(|id| sans.iter().any(|san| san == id))
            })
            .map(|entry| entry.name.clone())
    }

    /// A tonic interceptor that refuses requests without a valid service token
    /// (`UNAUTHENTICATED`) and puts the caller's name in the request extensions as
    /// [`Caller`].
    pub fn interceptor(&self) -> CallerInterceptor {
        CallerInterceptor {
            callers: self.clone(),
        }
    }
}

/// The internal caller of a request, as [`CallerInterceptor`] found it; read it with
/// `request.extensions().get::<Caller>()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

/// See [`Callers::interceptor`].
#[derive(Debug, Clone)]
pub struct CallerInterceptor {
    callers: Callers,
}

impl Interceptor for CallerInterceptor {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let name = self.callers.authenticate(request.metadata())?;
        request.extensions_mut().insert(Caller(name));
        Ok(request)
    }
}

/// The URI subject alternative names of a DER certificate (SPIFFE IDs among them);
/// empty when it has none or does not parse.
pub fn uri_sans(certificate: &[u8]) -> Vec<String> {
    use x509_cert::der::Decode;
    use x509_cert::ext::pkix::SubjectAltName;
    use x509_cert::ext::pkix::name::GeneralName;

    let Ok(certificate) = x509_cert::Certificate::from_der(certificate) else {
        return Vec::new();
    };
    let Ok(Some((_, names))) = certificate.tbs_certificate.get::<SubjectAltName>() else {
        return Vec::new();
    };
    names
        .0
        .into_iter()
        .filter_map(|name| {
            if let GeneralName::UniformResourceIdentifier(uri) = name {
                Some(uri.to_string())
            } else {
                None
            }
        })
        .collect()
}

/// Whether `text` looks like an absolute URI (`scheme:rest`), as SANs are.
fn is_uri(text: &str) -> bool {
    match text.split_once(':') {
        Some((scheme, rest)) => {
            !rest.is_empty()
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
                && !text.chars().any(|c| c.is_control() || c == ' ')
        }
        None => false,
    }
}

/// Equality of two byte strings in time that depends on their lengths only, never on
/// where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        let a = [5u8; 40];
        let mut b = a;
        assert!(constant_time_eq(&a, &b));
        b[39] ^= 1;
        assert!(!constant_time_eq(&a, &b));
        b = a;
        b[0] ^= 0x80;
        assert!(!constant_time_eq(&a, &b));
        assert!(!constant_time_eq(&a, &a[..39]), "a prefix is not the token");
        assert!(!constant_time_eq(&a[..0], &a), "nor is nothing");
    }

    #[test]
    fn debug_shows_names_only() {
        let token = "t".repeat(40);
        let callers = Callers::from_tokens([("orchestrator".to_owned(), token.clone())]).unwrap();
        let shown = format!("{:?}", callers.interceptor());
        assert!(shown.contains("orchestrator"), "{shown}");
        assert!(!shown.contains(&token), "{shown}");
    }
}
