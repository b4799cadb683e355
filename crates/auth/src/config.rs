//! `auth`: how a service verifies the JWTs of public API callers.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Largest `auth.leeway_s`: clock skew beyond five minutes is a broken clock, and a
/// larger leeway would keep expired tokens alive that long.
pub(crate) const MAX_LEEWAY_S: u64 = 300;
/// Smallest `auth.jwks_refresh_s`: an identity provider is not polled more often.
pub(crate) const MIN_JWKS_REFRESH_S: u64 = 10;

/// Whether callers of the public API must present a JWT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    /// No authentication: every caller is anonymous (development, or a trusted network).
    #[default]
    None,
    /// Every call carries `authorization: Bearer <JWT>`, verified with the configured keys.
    Jwt,
}

/// The `auth` section of a service's configuration.
///
/// With `mode = "jwt"` exactly one key source is set: `hs256_secret_file` (a shared
/// secret, for development and tests), `jwks_file` or `jwks_url` (the identity provider's
/// public keys: RS256, ES256 or EdDSA).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// `none` (default) or `jwt`.
    pub mode: AuthMode,
    /// A file holding the HS256 secret (at least 32 bytes, surrounding whitespace trimmed).
    pub hs256_secret_file: Option<PathBuf>,
    /// A file holding a JWK set (public keys).
    pub jwks_file: Option<PathBuf>,
    /// An `http(s)` URL serving a JWK set, fetched at start and every `jwks_refresh_s`.
    pub jwks_url: Option<String>,
    /// The required `iss` claim.
    pub issuer: Option<String>,
    /// The required `aud` claim (a token's `aud` may be a list that contains it).
    pub audience: Option<String>,
    /// The claim holding the tenant, a string (default `tenant`).
    pub tenant_claim: String,
    /// The claim holding the roles, a list of strings (default `roles`); absent = no roles.
    pub roles_claim: String,
    /// The role that may approve held tool calls (default `approver`).
    pub approver_role: String,
    /// The role that may settle effects the runtime could not reconcile (default
    /// `operator`).
    pub operator_role: String,
    /// The role whose holders read and answer every tenant's invocations: a platform's
    /// operators. Unset (the default): every caller sees its own tenant only.
    pub all_tenants_role: Option<String>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds (default 30, at most 300).
    pub leeway_s: u64,
    /// How often a `jwks_url` is fetched again, in seconds (default 300, at least 10).
    pub jwks_refresh_s: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            mode: AuthMode::None,
            hs256_secret_file: None,
            jwks_file: None,
            jwks_url: None,
            issuer: None,
            audience: None,
            tenant_claim: "tenant".to_owned(),
            roles_claim: "roles".to_owned(),
            approver_role: "approver".to_owned(),
            operator_role: "operator".to_owned(),
            all_tenants_role: None,
            leeway_s: 30,
            jwks_refresh_s: 300,
        }
    }
}

impl AuthConfig {
    /// Whether calls must carry a JWT (`mode = "jwt"`).
    pub fn is_on(&self) -> bool {
        self.mode == AuthMode::Jwt
    }

    /// Checks the rules that need no I/O; the message names the key at fault.
    ///
    /// With `mode = "jwt"`: exactly one of `hs256_secret_file`, `jwks_file`, `jwks_url`;
    /// `issuer` and `audience` set and non-empty; `leeway_s <= 300`; `jwks_refresh_s >= 10`;
    /// claim and role names non-empty; `jwks_url` an `http` or `https` URL. With
    /// `mode = "none"` the key settings may be present (to switch modes by one line) and
    /// are not checked.
    pub fn validate(&self) -> Result<(), String> {
        if !self.is_on() {
            return Ok(());
        }
        let sources = [
            self.hs256_secret_file.is_some(),
            self.jwks_file.is_some(),
            self.jwks_url.is_some(),
        ]
        .into_iter()
        .filter(|set| *set)
        .count();
        if sources != 1 {
            return Err(format!(
                "auth.mode = \"jwt\" needs exactly one of auth.hs256_secret_file, \
                 auth.jwks_file, auth.jwks_url ({sources} set)"
            ));
        }
        for (key, path) in [
            ("auth.hs256_secret_file", &self.hs256_secret_file),
            ("auth.jwks_file", &self.jwks_file),
        ] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(format!("{key} must not be empty"));
            }
        }
        if let Some(url) = &self.jwks_url {
            check_url(url)?;
        }
        for (key, value) in [
            ("auth.issuer", &self.issuer),
            ("auth.audience", &self.audience),
        ] {
            if value.as_deref().is_none_or(|v| v.trim().is_empty()) {
                return Err(format!("{key} is required with auth.mode = \"jwt\""));
            }
        }
        for (key, value) in [
            ("auth.tenant_claim", &self.tenant_claim),
            ("auth.roles_claim", &self.roles_claim),
            ("auth.approver_role", &self.approver_role),
            ("auth.operator_role", &self.operator_role),
        ] {
            if value.trim().is_empty() {
                return Err(format!("{key} must not be empty"));
            }
        }
        if self
            .all_tenants_role
            .as_deref()
            .is_some_and(|role| role.trim().is_empty())
        {
            return Err("auth.all_tenants_role must not be empty when set".to_owned());
        }
        if self.leeway_s > MAX_LEEWAY_S {
            return Err(format!(
                "auth.leeway_s must be at most {MAX_LEEWAY_S} (got {})",
                self.leeway_s
            ));
        }
        if self.jwks_refresh_s < MIN_JWKS_REFRESH_S {
            return Err(format!(
                "auth.jwks_refresh_s must be at least {MIN_JWKS_REFRESH_S} (got {})",
                self.jwks_refresh_s
            ));
        }
        Ok(())
    }
}

/// `auth.jwks_url` must be an absolute `http` or `https` URL with a host.
fn check_url(url: &str) -> Result<(), String> {
    let parsed =
        reqwest::Url::parse(url).map_err(|e| format!("auth.jwks_url is not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none_or(str::is_empty) {
        return Err("auth.jwks_url must be an http:// or https:// URL".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let config = AuthConfig::default();
        assert_eq!(config.mode, AuthMode::None);
        assert!(!config.is_on());
        assert_eq!(config.tenant_claim, "tenant");
        assert_eq!(config.roles_claim, "roles");
        assert_eq!(config.approver_role, "approver");
        assert_eq!(config.operator_role, "operator");
        assert_eq!(
            config.all_tenants_role, None,
            "nobody sees every tenant by default"
        );
        assert_eq!(config.leeway_s, 30);
        assert_eq!(config.jwks_refresh_s, 300);
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn serde_names() {
        let config: AuthConfig = serde_json::from_str(
            r#"{"mode":"jwt","jwks_url":"https://id.example/jwks","issuer":"i","audience":"a"}"#,
        )
        .unwrap();
        assert!(config.is_on());
        assert_eq!(config.leeway_s, 30);
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(serde_json::to_value(AuthMode::None).unwrap(), "none");
        assert!(serde_json::from_str::<AuthConfig>(r#"{"mode":"JWT"}"#).is_err());
        assert!(serde_json::from_str::<AuthConfig>(r#"{"secret":"x"}"#).is_err());
    }
}
