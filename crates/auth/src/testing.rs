//! A token issuer for tests: real tokens, signed with keys generated on the spot.
//!
//! ```no_run
//! # async fn example() {
//! use agentloop_auth::Authenticator;
//! use agentloop_auth::testing::{Alg, TokenIssuer};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let issuer = TokenIssuer::new(Alg::Es256);
//! let config = issuer.write_key_source(dir.path());
//! let auth = Authenticator::from_config(&config).await.unwrap().unwrap();
//! let identity = auth.verify(&issuer.token("alice", "acme", &["approver"])).await.unwrap();
//! assert_eq!(identity.actor, "alice");
//! # }
//! ```
//!
//! Keys are generated with `ring` (HS256 secret, P-256, Ed25519) and, for RS256, with the
//! `rsa` crate (2048 bits), which ring cannot do; signing is `jsonwebtoken`'s, as in
//! production. Only public keys are written to JWKS files.

// Test harness: a broken environment is reported by panicking, exactly as in a test.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _,
};
use serde_json::{Value, json};

use crate::{AuthConfig, AuthMode};

/// The `iss` of [`TokenIssuer::token`] and of [`TokenIssuer::write_key_source`]'s config.
pub const ISSUER: &str = "https://id.test";
/// The `aud` of [`TokenIssuer::token`] and of [`TokenIssuer::write_key_source`]'s config.
pub const AUDIENCE: &str = "agentloop";
/// How long a [`TokenIssuer::token`] is valid, in seconds (10 minutes).
pub const TOKEN_VALID_S: u64 = 600;

/// A signing algorithm [`TokenIssuer`] can generate a key for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    /// HMAC SHA-256 with a random 32-byte secret.
    Hs256,
    /// RSA PKCS#1 v1.5 SHA-256 with a 2048-bit key.
    Rs256,
    /// ECDSA P-256 SHA-256.
    Es256,
    /// Ed25519.
    EdDsa,
}

impl Alg {
    /// Every algorithm, for tests that cover all of them.
    pub const ALL: [Alg; 4] = [Alg::Hs256, Alg::Rs256, Alg::Es256, Alg::EdDsa];

    /// The `jsonwebtoken` algorithm, as it appears in a token header.
    pub fn algorithm(self) -> Algorithm {
        match self {
            Alg::Hs256 => Algorithm::HS256,
            Alg::Rs256 => Algorithm::RS256,
            Alg::Es256 => Algorithm::ES256,
            Alg::EdDsa => Algorithm::EdDSA,
        }
    }
}

/// Mints tokens with one freshly generated key and a random `kid`.
pub struct TokenIssuer {
    alg: Alg,
    kid: String,
    encoding: EncodingKey,
    /// The HS256 secret, or the public JWK.
    public: Public,
}

enum Public {
    Secret(String),
    Jwk(Value),
}

impl std::fmt::Debug for TokenIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenIssuer")
            .field("alg", &self.alg)
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl TokenIssuer {
    /// A new key for `alg`. RS256 generates a 2048-bit RSA key, which takes noticeably
    /// longer than the others (see the crate's tests for the measured time).
    pub fn new(alg: Alg) -> TokenIssuer {
        let rng = SystemRandom::new();
        let kid = URL_SAFE_NO_PAD.encode(random_bytes::<9>(&rng));
        let (encoding, public) = match alg {
            Alg::Hs256 => {
                let secret = URL_SAFE_NO_PAD.encode(random_bytes::<32>(&rng));
                (
                    EncodingKey::from_secret(secret.as_bytes()),
                    Public::Secret(secret),
                )
            }
            Alg::Rs256 => {
                use rsa::pkcs1::EncodeRsaPrivateKey as _;
                use rsa::traits::PublicKeyParts as _;
                let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).unwrap();
                let der = key.to_pkcs1_der().unwrap();
                let jwk = json!({
                    "kty": "RSA",
                    "n": URL_SAFE_NO_PAD.encode(key.n().to_bytes_be()),
                    "e": URL_SAFE_NO_PAD.encode(key.e().to_bytes_be()),
                });
                (EncodingKey::from_rsa_der(der.as_bytes()), Public::Jwk(jwk))
            }
            Alg::Es256 => {
                let pkcs8 =
                    EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
                let pair = EcdsaKeyPair::from_pkcs8(
                    &ECDSA_P256_SHA256_FIXED_SIGNING,
                    pkcs8.as_ref(),
                    &rng,
                )
                .unwrap();
                // Uncompressed point: 0x04, then x and y, 32 bytes each.
                let point = pair.public_key().as_ref();
                let jwk = json!({
                    "kty": "EC",
                    "crv": "P-256",
                    "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
                    "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
                });
                (EncodingKey::from_ec_der(pkcs8.as_ref()), Public::Jwk(jwk))
            }
            Alg::EdDsa => {
                let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
                let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
                let jwk = json!({
                    "kty": "OKP",
                    "crv": "Ed25519",
                    "x": URL_SAFE_NO_PAD.encode(pair.public_key().as_ref()),
                });
                (EncodingKey::from_ed_der(pkcs8.as_ref()), Public::Jwk(jwk))
            }
        };
        let public = match public {
            Public::Jwk(mut jwk) => {
                jwk["kid"] = json!(kid);
                jwk["use"] = json!("sig");
                jwk["alg"] = json!(format!("{:?}", alg.algorithm()));
                Public::Jwk(jwk)
            }
            secret @ Public::Secret(_) => secret,
        };
        TokenIssuer {
            alg,
            kid,
            encoding,
            public,
        }
    }

    /// The `kid` every token of this issuer carries (and its JWK has).
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// Writes the key source into `dir` (the HS256 secret file, or a JWKS file with the
    /// public key only, named after the `kid`) and returns an [`AuthConfig`] with
    /// `mode = "jwt"`, that source, issuer [`ISSUER`] and audience [`AUDIENCE`].
    pub fn write_key_source(&self, dir: &Path) -> AuthConfig {
        let mut config = AuthConfig {
            mode: AuthMode::Jwt,
            issuer: Some(ISSUER.to_owned()),
            audience: Some(AUDIENCE.to_owned()),
            ..AuthConfig::default()
        };
        match &self.public {
            Public::Secret(secret) => {
                let path = dir.join(format!("{}.hs256", self.kid));
                std::fs::write(&path, format!("{secret}\n")).unwrap();
                config.hs256_secret_file = Some(path);
            }
            Public::Jwk(_) => {
                let path = dir.join(format!("{}.jwks.json", self.kid));
                std::fs::write(&path, self.jwks_json()).unwrap();
                config.jwks_file = Some(path);
            }
        }
        config
    }

    /// The public JWK of this key (`kid`, `use: sig` and `alg` set), e.g. to build a set of
    /// several keys. Panics for HS256: a secret is never published in a key set, and the
    /// verifier refuses `oct` keys.
    pub fn jwk(&self) -> Value {
        match &self.public {
            Public::Jwk(jwk) => jwk.clone(),
            Public::Secret(_) => panic!("an HS256 issuer has no public JWK; use write_key_source"),
        }
    }

    /// The public JWK set `{"keys": [jwk]}`, e.g. to serve from a test JWKS URL. Panics for
    /// HS256 (see [`TokenIssuer::jwk`]).
    pub fn jwks_json(&self) -> String {
        json!({ "keys": [self.jwk()] }).to_string()
    }

    /// A token for `actor` in `tenant` with `roles` (claims `sub`, `tenant`, `roles`),
    /// issued now, valid for [`TOKEN_VALID_S`], with `iss` [`ISSUER`] and `aud` [`AUDIENCE`].
    pub fn token(&self, actor: &str, tenant: &str, roles: &[&str]) -> String {
        let now = now_s();
        self.token_with(json!({
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": actor,
            "tenant": tenant,
            "roles": roles,
            "iat": now,
            "exp": now + TOKEN_VALID_S,
        }))
    }

    /// A token with exactly `claims`, signed with this key, its header carrying this
    /// issuer's algorithm and `kid`.
    pub fn token_with(&self, claims: Value) -> String {
        let mut header = Header::new(self.alg.algorithm());
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, &claims, &self.encoding).unwrap()
    }
}

/// Seconds since the Unix epoch, the clock `exp`, `nbf` and `iat` are measured on.
pub fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn random_bytes<const N: usize>(rng: &SystemRandom) -> [u8; N] {
    let mut bytes = [0; N];
    rng.fill(&mut bytes).unwrap();
    bytes
}
