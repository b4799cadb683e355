//! [`Authenticator`]: JWT verification for callers of the public API.
//!
//! The key decides the algorithm, never the token: each key is bound at load time to the
//! one algorithm it is for (a secret to HS256; an RSA key to RS256, a P-256 key to ES256,
//! an Ed25519 key to EdDSA), and a token whose header names another algorithm is refused
//! before any cryptography. That closes `alg: none` and the classic confusion of an RSA
//! public key used as an HMAC secret. A shared secret inside a JWKS (`kty: oct`) is never
//! loaded: a published key set holds public keys only.

use std::sync::{Arc, Weak};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{
    AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, KeyOperations, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use tokio::sync::{Mutex, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tonic::metadata::MetadataMap;

use crate::bearer::{MAX_TOKEN_BYTES, bearer_token};
use crate::identity::is_valid_identity;
use crate::secret::{read_bounded, read_secret_at_least};
use crate::{AuthConfig, AuthConfigError, AuthError, Identity};

/// Shortest HS256 secret, in bytes: RFC 7518 §3.2 asks for a key at least the hash size.
const MIN_HS256_SECRET_BYTES: usize = 32;
/// Largest JWKS accepted, from a file or a URL (1 MiB; real sets are a few KiB).
const MAX_JWKS_BYTES: u64 = 1024 * 1024;
/// Bound on one JWKS fetch, connection to last byte.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Least time between two fetches caused by tokens with an unknown `kid`, so tokens with
/// made-up key IDs cannot turn this service into a load generator for the provider.
const UNKNOWN_KID_REFETCH: Duration = Duration::from_secs(10);
/// Most redirects a JWKS fetch follows.
const MAX_REDIRECTS: usize = 5;
/// Most roles one token may carry.
const MAX_ROLES: usize = 256;
/// RSA moduli ring verifies with (2048 to 8192 bits), in bytes.
const RSA_MODULUS_BYTES: std::ops::RangeInclusive<usize> = 256..=1024;

/// Verifies `authorization: Bearer <JWT>` and yields the caller's [`Identity`].
///
/// Built once per process by [`Authenticator::from_config`]; cloning is cheap (one
/// `Arc`). With a `jwks_url`, a background task fetches the key set again every
/// `jwks_refresh_s` and ends when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct Authenticator {
    inner: Arc<Inner>,
}

struct Inner {
    rules: Rules,
    /// The current keys. Readers take a cheap snapshot; a refresh replaces the whole set.
    keys: watch::Sender<Arc<KeySet>>,
    /// Tokens verified lately.
    verified: Verified,
    /// Set for a `jwks_url` source.
    remote: Option<Remote>,
    /// Dropped with the last `Authenticator`, which stops the refresh task at once.
    _stop: Option<oneshot::Sender<()>>,
}

/// What a verified token must say, and where the identity is in its claims.
#[derive(Debug)]
struct Rules {
    /// Issuer, audience, leeway, required claims; `algorithms` is set per key.
    validation: Validation,
    tenant_claim: String,
    roles_claim: String,
    approver_role: String,
    operator_role: String,
    all_tenants_role: Option<String>,
}

/// The keys tokens may be signed with.
struct KeySet {
    keys: Vec<Arc<Key>>,
    /// `false` for a secret file: its one key verifies every token, whatever its `kid`.
    by_kid: bool,
}

struct Key {
    kid: Option<String>,
    /// The one algorithm this key verifies.
    alg: Algorithm,
    decoding: DecodingKey,
}

/// A JWKS URL and what fetching it needs.
struct Remote {
    url: reqwest::Url,
    /// The URL as messages show it: no credentials, no query.
    shown: String,
    client: reqwest::Client,
    /// When a token with an unknown `kid` last caused a fetch. The lock also makes
    /// concurrent such tokens wait for one fetch instead of each starting their own.
    last_unknown_kid_fetch: Mutex<Option<Instant>>,
}

impl Authenticator {
    /// `None` for `mode = "none"`. Otherwise loads the keys: reads the secret or JWKS file,
    /// or fetches the JWKS URL once (a failure is an error: the service must not start
    /// without keys) and spawns a Tokio task that fetches it again every
    /// `jwks_refresh_s`. A token with an unknown `kid` causes at most one extra fetch per
    /// 10 s before it is rejected, so a key the provider just rotated in is picked up.
    ///
    /// For a `jwks_url`, installs `ring` as the rustls crypto provider if none is installed
    /// yet (the workspace builds rustls without a default provider).
    pub async fn from_config(
        config: &AuthConfig,
    ) -> Result<Option<Authenticator>, AuthConfigError> {
        let refresh = Duration::from_secs(config.jwks_refresh_s);
        Ok(Self::start(config, refresh)
            .await?
            .map(|(auth, _task)| auth))
    }

    /// [`Authenticator::from_config`] with the refresh period given, also returning the
    /// refresh task (for a `jwks_url`).
    async fn start(
        config: &AuthConfig,
        refresh: Duration,
    ) -> Result<Option<(Authenticator, Option<JoinHandle<()>>)>, AuthConfigError> {
        config.validate().map_err(AuthConfigError::Invalid)?;
        if !config.is_on() {
            return Ok(None);
        }
        let (keys, remote) = if let Some(path) = &config.hs256_secret_file {
            let secret =
                read_secret_at_least("auth.hs256_secret_file", path, MIN_HS256_SECRET_BYTES)?;
            (KeySet::secret(secret.as_bytes()), None)
        } else if let Some(path) = &config.jwks_file {
            let bytes = read_bounded("auth.jwks_file", path, MAX_JWKS_BYTES)?;
            let keys = KeySet::from_jwks(&bytes).map_err(|problem| AuthConfigError::Jwks {
                key: "auth.jwks_file",
                location: path.display().to_string(),
                problem,
            })?;
            (keys, None)
        } else if let Some(url) = &config.jwks_url {
            let remote = Remote::new(url)?;
            (remote.fetch().await?, Some(remote))
        } else {
            return Err(AuthConfigError::Invalid(
                "auth.mode = \"jwt\" needs a key source".to_owned(),
            ));
        };
        tracing::info!(keys = keys.keys.len(), "JWT verification keys loaded");

        let (stop, stopped) = oneshot::channel();
        let is_remote = remote.is_some();
        let inner = Arc::new(Inner {
            rules: Rules::new(config),
            keys: watch::Sender::new(Arc::new(keys)),
            verified: Verified::default(),
            remote,
            _stop: is_remote.then_some(stop),
        });
        let task = is_remote.then(|| spawn_refresh(Arc::downgrade(&inner), refresh, stopped));
        Ok(Some((Authenticator { inner }, task)))
    }

    /// Reads `authorization: Bearer <JWT>` from `metadata` and [verifies](Self::verify) it.
    pub async fn authenticate(&self, metadata: &MetadataMap) -> Result<Identity, AuthError> {
        self.verify(bearer_token(metadata)?).await
    }

    /// Verifies a JWT: size, key (by `kid`), algorithm bound to that key, signature, `exp`
    /// (required) and `nbf` within the leeway, `iss`, `aud`, then the identity claims.
    ///
    /// A token verified before answers from memory until its `exp` (without leeway), as
    /// long as the key set that verified it is the current one.
    pub async fn verify(&self, token: &str) -> Result<Identity, AuthError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(AuthError::Rejected("token too large"));
        }
        let now = unix_now();
        let current = self.inner.keys.borrow().clone();
        if let Some(identity) = self.inner.verified.get(token, now, &current) {
            return Ok(identity);
        }
        // An unsupported `alg` (including "none") fails here: it is not an `Algorithm`.
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| AuthError::Rejected("not a JWT with a supported algorithm"))?;
        let kid = header.kid.as_deref();
        let key = match self.inner.find(kid) {
            Some(key) => key,
            None => self
                .inner
                .find_after_fetch(kid)
                .await
                .ok_or(AuthError::Rejected("unknown signing key"))?,
        };
        if header.alg != key.alg {
            return Err(AuthError::Rejected("algorithm not allowed for this key"));
        }
        let mut validation = self.inner.rules.validation.clone();
        validation.algorithms = vec![key.alg];
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, &validation)
            .map_err(rejection)?;
        let identity = self.inner.rules.identity(&data.claims)?;
        // Remembered with the set that holds its key (a fetch may have replaced the set
        // this call started with); not at all when a refresh dropped the key meanwhile.
        let current = self.inner.keys.borrow().clone();
        if let Some(exp) = data.claims.get("exp").and_then(Value::as_u64)
            && current.keys.iter().any(|k| Arc::ptr_eq(k, &key))
        {
            self.inner
                .verified
                .put(token, identity.clone(), exp, &current);
        }
        Ok(identity)
    }

    /// The role that may approve held tool calls (`auth.approver_role`).
    pub fn approver_role(&self) -> &str {
        &self.inner.rules.approver_role
    }

    /// The role that may settle effects the runtime could not reconcile
    /// (`auth.operator_role`).
    pub fn operator_role(&self) -> &str {
        &self.inner.rules.operator_role
    }

    /// The role whose holders read and answer every tenant's invocations
    /// (`auth.all_tenants_role`), if one is set.
    pub fn all_tenants_role(&self) -> Option<&str> {
        self.inner.rules.all_tenants_role.as_deref()
    }
}

impl Inner {
    /// The key for a token with this `kid`, from the current set.
    fn find(&self, kid: Option<&str>) -> Option<Arc<Key>> {
        self.keys.borrow().find(kid)
    }

    /// For a `jwks_url`: fetches the set again, unless a token with an unknown `kid` did
    /// less than [`UNKNOWN_KID_REFETCH`] ago, and looks again.
    async fn find_after_fetch(&self, kid: Option<&str>) -> Option<Arc<Key>> {
        let remote = self.remote.as_ref()?;
        let mut last = remote.last_unknown_kid_fetch.lock().await;
        // Another token may have caused the fetch while this one waited for the lock.
        if let Some(key) = self.find(kid) {
            return Some(key);
        }
        if last.is_some_and(|at| at.elapsed() < UNKNOWN_KID_REFETCH) {
            return None;
        }
        *last = Some(Instant::now());
        self.refresh(remote).await;
        self.find(kid)
    }

    /// Replaces the keys with a fresh fetch; on failure keeps the keys it has.
    async fn refresh(&self, remote: &Remote) {
        match remote.fetch().await {
            Ok(keys) => {
                tracing::debug!(keys = keys.keys.len(), "JWKS refreshed");
                self.keys.send_replace(Arc::new(keys));
            }
            Err(error) => tracing::warn!(%error, "JWKS refresh failed; keeping the current keys"),
        }
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = self.keys.borrow();
        let kids: Vec<_> = keys.keys.iter().map(|k| (k.kid.clone(), k.alg)).collect();
        f.debug_struct("Inner")
            .field("rules", &self.rules)
            .field("keys", &kids)
            .field("jwks_url", &self.remote.as_ref().map(|r| &r.shown))
            .finish_non_exhaustive()
    }
}

/// Fetches the key set every `every` until `stopped` fires (the last `Authenticator` was
/// dropped). The task holds only a `Weak` between fetches.
fn spawn_refresh(
    inner: Weak<Inner>,
    every: Duration,
    mut stopped: oneshot::Receiver<()>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                _ = ticks.tick() => {}
            }
            let Some(inner) = inner.upgrade() else {
                break;
            };
            if let Some(remote) = &inner.remote {
                inner.refresh(remote).await;
            }
        }
    })
}

impl Rules {
    fn new(config: &AuthConfig) -> Rules {
        // `algorithms` is replaced by the key's own algorithm on every verification.
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = config.leeway_s;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.set_issuer(&[config.issuer.as_deref().unwrap_or_default()]);
        validation.set_audience(&[config.audience.as_deref().unwrap_or_default()]);
        Rules {
            validation,
            tenant_claim: config.tenant_claim.clone(),
            roles_claim: config.roles_claim.clone(),
            approver_role: config.approver_role.clone(),
            operator_role: config.operator_role.clone(),
            all_tenants_role: config.all_tenants_role.clone(),
        }
    }

    /// The identity in verified claims: `sub`, the tenant claim, the roles claim.
    fn identity(&self, claims: &Map<String, Value>) -> Result<Identity, AuthError> {
        let actor = match claims.get("sub") {
            Some(Value::String(sub)) if is_valid_identity(sub) => sub.clone(),
            Some(_) => return Err(AuthError::Rejected("invalid sub claim")),
            None => return Err(AuthError::Rejected("missing sub claim")),
        };
        let tenant = match claims.get(&self.tenant_claim) {
            Some(Value::String(tenant)) if is_valid_identity(tenant) => tenant.clone(),
            Some(Value::String(_)) => return Err(AuthError::Rejected("invalid tenant claim")),
            Some(_) => return Err(AuthError::Rejected("tenant claim is not a string")),
            None => return Err(AuthError::Rejected("missing tenant claim")),
        };
        let roles = match claims.get(&self.roles_claim) {
            None => Vec::new(),
            Some(Value::Array(items)) if items.len() <= MAX_ROLES => items
                .iter()
                .map(|item| match item.as_str() {
                    Some(role) if is_valid_identity(role) => Ok(role.to_owned()),
                    Some(_) | None => Err(AuthError::Rejected("invalid roles claim")),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(AuthError::Rejected("invalid roles claim")),
        };
        Ok(Identity {
            actor,
            tenant,
            roles,
        })
    }
}

/// A short reason for a token `jsonwebtoken` refused.
fn rejection(error: jsonwebtoken::errors::Error) -> AuthError {
    use jsonwebtoken::errors::ErrorKind;
    // `ErrorKind` is `#[non_exhaustive]`: the final wildcard is required; new kinds reject.
    let reason = match error.kind() {
        ErrorKind::InvalidSignature => "bad signature",
        ErrorKind::ExpiredSignature => "token expired",
        ErrorKind::ImmatureSignature => "token not yet valid",
        ErrorKind::InvalidIssuer => "wrong issuer",
        ErrorKind::InvalidAudience => "wrong audience",
        ErrorKind::InvalidAlgorithm => "algorithm not allowed for this key",
        ErrorKind::MissingRequiredClaim(claim) => match claim.as_str() {
            "exp" => "missing exp claim",
            "iss" => "missing iss claim",
            "aud" => "missing aud claim",
            "sub" => "missing sub claim",
            _ => "missing required claim",
        },
        ErrorKind::InvalidToken
        | ErrorKind::Base64(_)
        | ErrorKind::Json(_)
        | ErrorKind::Utf8(_) => "malformed token",
        // Key, signing and configuration faults: not this token's to explain, still a no.
        ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::RsaFailedSigning
        | ErrorKind::InvalidAlgorithmName
        | ErrorKind::InvalidKeyFormat
        | ErrorKind::InvalidSubject
        | ErrorKind::MissingAlgorithm
        | ErrorKind::Crypto(_)
        | _ => "token rejected",
    };
    AuthError::Rejected(reason)
}

/// Most tokens [`Verified`] remembers; when full it starts over.
const MAX_VERIFIED: usize = 10_000;

/// Tokens verified lately, by their text. A caller sends the same token with every call,
/// and verifying one (base64, JSON, the signature) cost some 44,000 instructions for
/// HS256 in `agentloop bench --auth`, more than the rest of an in-process call; a
/// signature algorithm costs more still. An entry answers until the token's `exp` and
/// while the key set that verified it is the current one: a refresh that replaces the
/// keys forgets every token at once.
#[derive(Default)]
struct Verified {
    entries: std::sync::Mutex<std::collections::HashMap<Box<str>, Remembered>>,
}

struct Remembered {
    identity: Identity,
    exp: u64,
    keys: Weak<KeySet>,
}

impl Verified {
    fn get(&self, token: &str, now: u64, current: &Arc<KeySet>) -> Option<Identity> {
        let entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = entries.get(token)?;
        (now < entry.exp && std::ptr::eq(entry.keys.as_ptr(), Arc::as_ptr(current)))
            .then(|| entry.identity.clone())
    }

    fn put(&self, token: &str, identity: Identity, exp: u64, keys: &Arc<KeySet>) {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.len() >= MAX_VERIFIED {
            entries.clear();
        }
        entries.insert(
            token.into(),
            Remembered {
                identity,
                exp,
                keys: Arc::downgrade(keys),
            },
        );
    }
}

/// Seconds since the Unix epoch, as `exp` counts them.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

impl KeySet {
    fn secret(secret: &[u8]) -> KeySet {
        KeySet {
            keys: vec![Arc::new(Key {
                kid: None,
                alg: Algorithm::HS256,
                decoding: DecodingKey::from_secret(secret),
            })],
            by_kid: false,
        }
    }

    /// The usable keys of a JWK set; keys of other types, curves, uses or algorithms are
    /// skipped, and a set with none left is an error (the message for the config error).
    fn from_jwks(bytes: &[u8]) -> Result<KeySet, String> {
        #[derive(serde::Deserialize)]
        struct RawSet {
            keys: Vec<Value>,
        }
        let raw: RawSet =
            serde_json::from_slice(bytes).map_err(|e| format!("not a JWK set ({e})"))?;
        let total = raw.keys.len();
        let keys: Vec<_> = raw
            .keys
            .into_iter()
            .filter_map(|value| serde_json::from_value::<Jwk>(value).ok())
            .filter_map(|jwk| usable_key(&jwk))
            .map(Arc::new)
            .collect();
        if keys.is_empty() {
            return Err(format!(
                "no usable key among {total}: need an RS256 (RSA, 2048 to 8192 bits), \
                 ES256 (EC P-256) or EdDSA (OKP Ed25519) signature key"
            ));
        }
        if keys.len() < total {
            tracing::debug!(
                skipped = total - keys.len(),
                "JWKS keys skipped as unusable"
            );
        }
        Ok(KeySet { keys, by_kid: true })
    }

    /// The key for a token's `kid`: by exact match; a token without `kid` only when the
    /// set holds one key.
    fn find(&self, kid: Option<&str>) -> Option<Arc<Key>> {
        if !self.by_kid {
            return self.keys.first().cloned();
        }
        match kid {
            Some(kid) => self
                .keys
                .iter()
                .find(|key| key.kid.as_deref() == Some(kid))
                .cloned(),
            None if self.keys.len() == 1 => self.keys.first().cloned(),
            None => None,
        }
    }
}

/// `jwk` as a verification key bound to its one algorithm, or `None` if it is not one.
fn usable_key(jwk: &Jwk) -> Option<Key> {
    if jwk
        .common
        .public_key_use
        .as_ref()
        .is_some_and(|usage| *usage != PublicKeyUse::Signature)
    {
        return None;
    }
    if jwk
        .common
        .key_operations
        .as_ref()
        .is_some_and(|ops| !ops.contains(&KeyOperations::Verify))
    {
        return None;
    }
    let alg = match &jwk.algorithm {
        AlgorithmParameters::RSA(rsa) => {
            let modulus = URL_SAFE_NO_PAD.decode(&rsa.n).ok()?;
            let significant = modulus.iter().skip_while(|b| **b == 0).count();
            if !RSA_MODULUS_BYTES.contains(&significant) {
                return None;
            }
            Algorithm::RS256
        }
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => Algorithm::ES256,
            EllipticCurve::P384 | EllipticCurve::P521 | EllipticCurve::Ed25519 => return None,
        },
        AlgorithmParameters::OctetKeyPair(okp) => match okp.curve {
            EllipticCurve::Ed25519 => Algorithm::EdDSA,
            EllipticCurve::P256 | EllipticCurve::P384 | EllipticCurve::P521 => return None,
        },
        // A shared secret in a published key set is no secret: never a verification key.
        AlgorithmParameters::OctetKey(_) => return None,
    };
    let declared_matches = match jwk.common.key_algorithm {
        None => true,
        Some(declared) => matches!(
            (declared, alg),
            (KeyAlgorithm::RS256, Algorithm::RS256)
                | (KeyAlgorithm::ES256, Algorithm::ES256)
                | (KeyAlgorithm::EdDSA, Algorithm::EdDSA)
        ),
    };
    if !declared_matches {
        return None;
    }
    let decoding = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key {
        kid: jwk.common.key_id.clone(),
        alg,
        decoding,
    })
}

impl Remote {
    fn new(url: &str) -> Result<Remote, AuthConfigError> {
        let url = reqwest::Url::parse(url)
            .map_err(|e| AuthConfigError::Invalid(format!("auth.jwks_url is not a URL ({e})")))?;
        let mut shown = url.clone();
        // Setting these fails only for URLs that cannot have credentials: nothing to hide.
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        shown.set_query(None);
        // An `Err` only means a provider is already installed, which is what we want.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                // The keys decide who is trusted: a redirect must not drop TLS.
                let from_https = attempt.previous().iter().any(|url| url.scheme() == "https");
                if attempt.previous().len() >= MAX_REDIRECTS {
                    attempt.error("too many redirects")
                } else if from_https && attempt.url().scheme() != "https" {
                    attempt.error("redirect from https to a plain URL")
                } else {
                    attempt.follow()
                }
            }))
            .build()
            .map_err(|e| AuthConfigError::Client(error_chain(&e)))?;
        Ok(Remote {
            url,
            shown: shown.to_string(),
            client,
            last_unknown_kid_fetch: Mutex::new(None),
        })
    }

    /// One GET of the key set: success status, at most [`MAX_JWKS_BYTES`], usable keys.
    async fn fetch(&self) -> Result<KeySet, AuthConfigError> {
        let failed = |reason: String| AuthConfigError::Fetch {
            url: self.shown.clone(),
            reason,
        };
        let too_large = || {
            failed(format!(
                "the response is larger than {MAX_JWKS_BYTES} bytes"
            ))
        };
        let mut response = self
            .client
            .get(self.url.clone())
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| failed(error_chain(&e.without_url())))?;
        let status = response.status();
        if !status.is_success() {
            return Err(failed(format!("HTTP status {status}")));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_JWKS_BYTES)
        {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| failed(error_chain(&e.without_url())))?
        {
            if (body.len() + chunk.len()) as u64 > MAX_JWKS_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        KeySet::from_jwks(&body).map_err(|problem| AuthConfigError::Jwks {
            key: "auth.jwks_url",
            location: self.shown.clone(),
            problem,
        })
    }
}

/// `error` and its sources, joined by `: ` (reqwest's own message is only the outermost).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Alg, TokenIssuer};
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    async fn serve(server: &MockServer, issuer: &TokenIssuer) {
        server.reset().await;
        Mock::given(method("GET"))
            .and(path("/jwks"))
            .respond_with(ResponseTemplate::new(200).set_body_string(issuer.jwks_json()))
            .mount(server)
            .await;
    }

    fn url_config(server: &MockServer, issuer: &TokenIssuer) -> AuthConfig {
        let dir = tempfile::tempdir().unwrap();
        AuthConfig {
            jwks_file: None,
            jwks_url: Some(format!("{}/jwks", server.uri())),
            ..issuer.write_key_source(dir.path())
        }
    }

    #[test]
    fn a_remembered_token_answers_until_its_exp_and_with_its_key_set_only() {
        let verified = Verified::default();
        let keys = Arc::new(KeySet::secret(&[7; 32]));
        let other = Arc::new(KeySet::secret(&[7; 32]));
        let alice = Identity {
            actor: "alice".into(),
            tenant: "acme".into(),
            roles: vec!["approver".into()],
        };
        verified.put("t", alice.clone(), 100, &keys);
        assert_eq!(verified.get("t", 99, &keys), Some(alice));
        assert_eq!(verified.get("t", 100, &keys), None, "expired at exp");
        assert_eq!(verified.get("t", 99, &other), None, "another key set");
        assert_eq!(verified.get("u", 99, &keys), None);
        for n in 0..MAX_VERIFIED {
            verified.put(&n.to_string(), alice_like(), 100, &keys);
        }
        let entries = verified.entries.lock().unwrap().len();
        assert!(entries <= MAX_VERIFIED, "bounded: {entries}");
    }

    fn alice_like() -> Identity {
        Identity {
            actor: "a".into(),
            tenant: "t".into(),
            roles: Vec::new(),
        }
    }

    /// A token verified with a key the provider then drops is refused once the new set
    /// is fetched, although it was remembered.
    #[tokio::test]
    async fn a_dropped_key_forgets_the_tokens_it_verified() {
        let server = MockServer::start().await;
        let old = TokenIssuer::new(Alg::Es256);
        let new = TokenIssuer::new(Alg::Es256);
        serve(&server, &old).await;
        let config = url_config(&server, &old);
        let (auth, _task) = Authenticator::start(&config, Duration::from_secs(3600))
            .await
            .unwrap()
            .unwrap();
        let token = old.token("alice", "acme", &[]);
        assert!(auth.verify(&token).await.is_ok());
        assert!(auth.verify(&token).await.is_ok(), "remembered");
        // The provider rotates; a token of the new key makes the set be fetched again.
        serve(&server, &new).await;
        assert!(auth.verify(&new.token("bob", "acme", &[])).await.is_ok());
        assert!(matches!(
            auth.verify(&token).await,
            Err(AuthError::Rejected("unknown signing key"))
        ));
    }

    /// The refresh task fetches on its period (not only on unknown kids), and ends as soon
    /// as the last `Authenticator` is dropped.
    #[tokio::test]
    async fn refresh_task_fetches_periodically_and_ends_with_the_authenticator() {
        let server = MockServer::start().await;
        let old = TokenIssuer::new(Alg::EdDsa);
        let new = TokenIssuer::new(Alg::EdDsa);
        serve(&server, &old).await;
        let config = url_config(&server, &old);
        let (auth, task) = Authenticator::start(&config, Duration::from_millis(50))
            .await
            .unwrap()
            .unwrap();
        let task = task.unwrap();
        assert!(auth.inner.find(Some(old.kid())).is_some());

        let mut keys = auth.inner.keys.subscribe();
        serve(&server, &new).await;
        let picked_up = async {
            loop {
                keys.changed().await.unwrap();
                if keys.borrow_and_update().find(Some(new.kid())).is_some() {
                    break;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), picked_up)
            .await
            .expect("the refresh task fetched the new key set");
        // Picked up by the period: no token with an unknown kid was presented.
        assert_eq!(
            *auth
                .inner
                .remote
                .as_ref()
                .unwrap()
                .last_unknown_kid_fetch
                .lock()
                .await,
            None
        );

        let clone = auth.clone();
        drop(auth);
        tokio::task::yield_now().await;
        assert!(!task.is_finished(), "a clone is still alive");
        drop(clone);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the refresh task ended with the last Authenticator")
            .unwrap();
    }

    #[test]
    fn key_types_other_than_signature_keys_are_skipped() {
        let issuer = TokenIssuer::new(Alg::Es256);
        let good: Value = serde_json::from_str(&issuer.jwks_json()).unwrap();
        let good_key = good["keys"][0].clone();
        let with = |patch: Value| {
            let mut key = good_key.clone();
            for (name, value) in patch.as_object().unwrap() {
                key[name] = value.clone();
            }
            serde_json::to_vec(&serde_json::json!({ "keys": [key] })).unwrap()
        };
        assert!(KeySet::from_jwks(&with(serde_json::json!({}))).is_ok());
        for patch in [
            serde_json::json!({"use": "enc"}),
            serde_json::json!({"key_ops": ["encrypt"]}),
            serde_json::json!({"alg": "ES384"}),
            serde_json::json!({"alg": "RS256"}),
            serde_json::json!({"crv": "P-384"}),
            serde_json::json!({"crv": "secp256k1"}),
        ] {
            let error = KeySet::from_jwks(&with(patch.clone())).err();
            assert!(
                error.is_some_and(|e| e.contains("no usable key")),
                "{patch}"
            );
        }
        let oct =
            br#"{"keys":[{"kty":"oct","kid":"k","k":"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"}]}"#;
        assert!(KeySet::from_jwks(oct).is_err());
        let small_rsa = br#"{"keys":[{"kty":"RSA","kid":"k","n":"AQAB","e":"AQAB"}]}"#;
        assert!(KeySet::from_jwks(small_rsa).is_err());
        assert!(
            KeySet::from_jwks(b"[]")
                .err()
                .unwrap()
                .starts_with("not a JWK set")
        );
    }

    #[test]
    fn kid_matching() {
        let a = TokenIssuer::new(Alg::EdDsa);
        let b = TokenIssuer::new(Alg::EdDsa);
        let one = KeySet::from_jwks(a.jwks_json().as_bytes()).unwrap();
        assert!(one.find(Some(a.kid())).is_some());
        assert!(one.find(None).is_some());
        assert!(one.find(Some(b.kid())).is_none());

        let mut both: Value = serde_json::from_str(&a.jwks_json()).unwrap();
        let other: Value = serde_json::from_str(&b.jwks_json()).unwrap();
        both["keys"]
            .as_array_mut()
            .unwrap()
            .push(other["keys"][0].clone());
        let two = KeySet::from_jwks(both.to_string().as_bytes()).unwrap();
        assert_eq!(
            two.find(Some(b.kid())).unwrap().kid.as_deref(),
            Some(b.kid())
        );
        assert!(two.find(None).is_none());

        let secret = KeySet::secret(&[7; 32]);
        assert!(secret.find(Some("anything")).is_some());
        assert!(secret.find(None).is_some());
    }
}
