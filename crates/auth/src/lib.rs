//! Identity for agentloop's gRPC services: who is calling, proven by a bearer token.
//!
//! Two kinds of caller reach agentloop, and each gets its own check:
//!
//! - **Callers of the public API** (the orchestrator's clients) present
//!   `authorization: Bearer <JWT>` issued by the platform's identity provider.
//!   [`Authenticator`] verifies the signature (HS256 with a secret file for development,
//!   RS256, ES256 or EdDSA with keys from a JWKS file or URL), the issuer, the audience and
//!   the validity window, and turns the claims into an [`Identity`]: actor, tenant, roles.
//!   The identity is what the ledger records and what policy decides on, so its strings
//!   are checked here once ([`Identity`]) instead of in every consumer.
//! - **Internal callers** (orchestrator → decision, policy, tools, ledger; tools gateway →
//!   executors) present `authorization: Bearer <service token>`: an opaque secret each
//!   callee's configuration lists per caller. [`Callers`] compares in constant time and
//!   names the caller; [`Callers::interceptor`] does it for a whole tonic service.
//!
//! Every failure is `UNAUTHENTICATED` on the wire ([`AuthError`]), with a short reason that
//! never echoes the token. Every configuration problem is an [`AuthConfigError`] naming the
//! key and the file or URL at fault, never the secret, so a service refuses to start
//! instead of running without keys.
//!
//! What this crate is not: it does not authorise (whether an identity may do something is
//! policy's question; [`Authenticator::approver_role`] and [`Authenticator::operator_role`]
//! only carry the configured role names there), it issues no production tokens (only
//! development HS256 ones, [`mint_hs256`], and `testing`'s, for tests), and it does not
//! terminate TLS.
//!
//! `testing` (feature `test-util`, enabled only by `[dev-dependencies]`) mints real tokens
//! with freshly generated keys; it panics where a test should fail.

#![warn(missing_docs)]

mod bearer;
mod callers;
mod config;
mod error;
mod identity;
mod jwt;
mod mint;
mod secret;
#[cfg(feature = "test-util")]
pub mod testing;

pub use bearer::MAX_TOKEN_BYTES;
pub use callers::{Caller, CallerConfig, CallerInterceptor, Callers, CallersConfig, uri_sans};
pub use config::{AuthConfig, AuthMode};
pub use error::{AuthConfigError, AuthError, FileProblem};
pub use identity::{Identity, is_valid_identity};
pub use jwt::Authenticator;
pub use mint::{DevToken, MintError, mint_hs256};
pub use secret::read_secret_file;
