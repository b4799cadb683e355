//! `agentloop-authz`: may this actor make this tool call? Trusted code's answer, per
//! call, before anything runs.
//!
//! [`Authorizer`] is the engine-neutral interface the policy service asks; [`Cedar`] is
//! the engine: policy files in the Cedar language, validated strictly at load against
//! the entity model ([`SCHEMA`], plus the `Arguments` type generated from the tools'
//! input schemas). A call is allowed when a `permit` is satisfied and no `forbid` is; it
//! needs a human when a satisfied `permit` carries the `@approval` annotation (see
//! [`APPROVAL_ANNOTATION`]); an evaluation error denies. Decisions name the IDs of the
//! deciding policies (their `@id` annotation, or `<file>#<n>`), never their text.
//!
//! Pure apart from reading policy files: no network, no clock, no global state, so a
//! policy set is judged the same in the service, in `agentloop policy check` and in
//! tests.

#![warn(missing_docs)]

mod arguments;
mod cedar;

pub use arguments::MAX_DEPTH;
pub use cedar::{
    APPROVAL_ANNOTATION, Cedar, ID_ANNOTATION, LoadError, MAX_POLICY_FILE_BYTES, Problem, SCHEMA,
    Source, version_of,
};

/// Who a call is made for.
#[derive(Debug, Clone, Copy)]
pub struct Principal<'a> {
    /// The invocation's actor.
    pub actor: &'a str,
    /// The invocation's tenant.
    pub tenant: &'a str,
    /// The roles the actor's token grants.
    pub roles: &'a [String],
}

/// One call to judge.
#[derive(Debug, Clone, Copy)]
pub struct CallRequest<'a> {
    /// The tool, by name.
    pub tool: &'a str,
    /// The call's arguments (a JSON object, already checked against the tool's schema).
    pub arguments: &'a serde_json::Value,
}

/// What the calls of one batch share.
#[derive(Debug, Clone, Copy)]
pub struct BatchContext<'a> {
    /// Who the calls are for.
    pub principal: Principal<'a>,
    /// The invocation's profile.
    pub profile: &'a str,
    /// A human approved exactly this batch.
    pub approved: bool,
    /// The turn of the batch.
    pub turn: u32,
}

/// A tool as authorization sees it: the resource's attributes and the argument types.
#[derive(Debug, Clone, Copy)]
pub struct ToolFacts<'a> {
    /// Its name, the resource's ID.
    pub name: &'a str,
    /// `read_only`, `idempotent_write` or `write`.
    pub side_effect: &'a str,
    /// The registry gates it behind a human approval.
    pub requires_approval: bool,
    /// Its input schema (JSON Schema text; empty: any object, no typed arguments).
    pub input_schema: &'a str,
}

/// The decision on one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// It may run.
    Allow,
    /// It may run once a human approves its batch.
    RequireApproval,
    /// It may not run.
    Deny,
}

/// The decision on one call, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallDecision {
    /// Allowed, gated or denied.
    pub effect: Effect,
    /// The IDs of the policies that decided it: the satisfied permits (the annotated
    /// ones, when it needs approval), the satisfied forbids, or those whose evaluation
    /// failed. Empty for a deny because no permit applies.
    pub policies: Vec<String>,
    /// Why it was denied without a forbid: evaluation errors (with their policy IDs)
    /// or arguments that cannot be expressed. Empty otherwise.
    pub errors: Vec<String>,
}

impl CallDecision {
    /// A denial for `error`, decided by no policy.
    pub fn refused(error: String) -> CallDecision {
        CallDecision {
            effect: Effect::Deny,
            policies: Vec::new(),
            errors: vec![error],
        }
    }
}

/// An authorization engine with a policy set loaded.
pub trait Authorizer: Send + Sync + std::fmt::Debug {
    /// The policy set's version: a digest of its sources, recorded with every turn it
    /// judges.
    fn version(&self) -> &str;

    /// One decision per call of `calls`, in order.
    fn authorize(&self, batch: &BatchContext<'_>, calls: &[CallRequest<'_>]) -> Vec<CallDecision>;
}
