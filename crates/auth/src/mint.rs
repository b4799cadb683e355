//! Development tokens: HS256 JWTs signed with the secret an orchestrator's
//! `auth.hs256_secret_file` names, for `agentloop token` and `agentloop bench --auth`.
//!
//! Production tokens come from the platform's identity provider (RS256, ES256 or EdDSA,
//! verified against its JWKS); this is for a laptop, a test cluster and the benchmark.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};

use crate::identity::is_valid_identity;

/// What a development token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevToken {
    /// `iss`: the orchestrator's `auth.issuer`.
    pub issuer: String,
    /// `aud`: the orchestrator's `auth.audience`.
    pub audience: String,
    /// `sub`: the actor.
    pub actor: String,
    /// `tenant`: the tenant (the default tenant claim).
    pub tenant: String,
    /// `roles`: the roles (the default roles claim).
    pub roles: Vec<String>,
    /// How long it is valid from now, in seconds.
    pub valid_for_s: u64,
}

/// Why a token could not be minted.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// The actor, tenant or a role breaks the identity rule ([`is_valid_identity`]).
    #[error("{0} must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ / + = -")]
    Identity(&'static str),
    /// The secret is shorter than 32 bytes, which verification refuses too.
    #[error("the HS256 secret must be at least 32 bytes")]
    ShortSecret,
    /// Signing failed.
    #[error("cannot sign the token: {0}")]
    Sign(#[from] jsonwebtoken::errors::Error),
}

/// An HS256 JWT for `token`, signed with `secret`, valid from now.
///
/// # Errors
///
/// [`MintError`] for an identity that no verifier would accept, a short secret, or a
/// signing failure.
pub fn mint_hs256(secret: &str, token: &DevToken) -> Result<String, MintError> {
    if secret.len() < 32 {
        return Err(MintError::ShortSecret);
    }
    if !is_valid_identity(&token.actor) {
        return Err(MintError::Identity("the actor"));
    }
    if !is_valid_identity(&token.tenant) {
        return Err(MintError::Identity("the tenant"));
    }
    if !token.roles.iter().all(|role| is_valid_identity(role)) {
        return Err(MintError::Identity("every role"));
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let claims = serde_json::json!({
        "iss": token.issuer,
        "aud": token.audience,
        "sub": token.actor,
        "tenant": token.tenant,
        "roles": token.roles,
        "iat": now,
        "nbf": now,
        "exp": now.saturating_add(token.valid_for_s),
    });
    Ok(jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )?)
}
