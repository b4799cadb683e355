//! Judging a batch of tool calls: structure, tool names, argument schemas, then the
//! profile's policies call by call, then approval gates. Which calls run together is not
//! policy's to say: the engine plans the stages from the tools' side effects, in one
//! place.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

use agentloop_authz::{Authorizer, BatchContext, CallRequest, Effect, Principal};
use agentloop_engine::{
    CallId, ErrorType, Fingerprint, Judgement, Permit, Refusal, Ruling, ToolCall, canonical_json,
};
use agentloop_proto::v1;
use agentloop_proto::v1::{EvaluateRequest, EvaluateResponse};
use serde_json::Value;

use crate::error::PolicyError;
use crate::profiles::ProfilePolicies;

/// Most calls one `Evaluate` request may carry; more is INVALID_ARGUMENT.
pub const MAX_CALLS: usize = 64;
/// Largest `arguments_json` of one call, in bytes; more is INVALID_ARGUMENT.
pub const MAX_ARGUMENTS_BYTES: usize = 1024 * 1024;
/// Most schema violations reported per call; the model needs the first few to repair,
/// not an unbounded list.
pub const MAX_SCHEMA_VIOLATIONS_PER_CALL: usize = 20;
/// Longest `invocation_id` accepted, in bytes.
pub const MAX_INVOCATION_ID_BYTES: usize = 256;

/// A batch to judge, and who proposes it.
#[derive(Debug, Clone, Copy)]
pub struct Proposal<'a> {
    /// The invocation (for the log only).
    pub invocation_id: &'a str,
    /// The turn that proposed the calls.
    pub turn: u32,
    /// The profile whose policies apply.
    pub profile: &'a str,
    /// Who the invocation acts for.
    pub principal: Principal<'a>,
    /// The calls.
    pub calls: &'a [ToolCall],
    /// The digest a human approved, if one did; it approves the batch only if it is
    /// the digest of exactly these calls.
    pub approved: Option<Fingerprint>,
}

struct CompiledTool {
    validator: jsonschema::Validator,
}

impl fmt::Debug for CompiledTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledTool").finish_non_exhaustive()
    }
}

/// The tool side of policy: every known tool with its compiled input schema, and the
/// approval gates.
///
/// Schemas are compiled once, here; an invalid schema fails construction (naming the
/// tool) rather than every call to that tool later.
#[derive(Debug)]
pub struct ToolPolicy {
    tools: BTreeMap<String, CompiledTool>,
    require_approval_for: BTreeSet<String>,
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl ToolPolicy {
    /// Whether `tool` is one of the tools it judges.
    pub fn knows(&self, tool: &str) -> bool {
        self.tools.contains_key(tool)
    }

    /// Compiles the descriptors' input schemas (an empty `input_schema_json` means "any
    /// JSON object") and gates the tools whose descriptor says `requires_approval`.
    ///
    /// # Errors
    ///
    /// [`PolicyError::DuplicateTool`] for a name given twice, [`PolicyError::InvalidSchema`]
    /// for a schema that is not JSON or not a valid JSON Schema (including one that
    /// needs a remote `$ref`: no network or file access is compiled in).
    pub fn new(descriptors: &[v1::ToolDescriptor]) -> Result<ToolPolicy, PolicyError> {
        let mut tools = BTreeMap::new();
        for descriptor in descriptors {
            if tools.contains_key(&descriptor.name) {
                return Err(PolicyError::DuplicateTool {
                    tool: descriptor.name.clone(),
                });
            }
            let schema: Value = if descriptor.input_schema_json.trim().is_empty() {
                Value::Object(serde_json::Map::new())
            } else {
                serde_json::from_str(&descriptor.input_schema_json).map_err(|e| {
                    PolicyError::InvalidSchema {
                        tool: descriptor.name.clone(),
                        detail: format!("not JSON: {e}"),
                    }
                })?
            };
            let validator =
                jsonschema::validator_for(&schema).map_err(|e| PolicyError::InvalidSchema {
                    tool: descriptor.name.clone(),
                    detail: e.to_string(),
                })?;
            tools.insert(descriptor.name.clone(), CompiledTool { validator });
        }
        // The registry's own gates; the configuration can add more.
        let require_approval_for = descriptors
            .iter()
            .filter(|d| d.requires_approval)
            .map(|d| d.name.clone())
            .collect();
        Ok(ToolPolicy {
            tools,
            require_approval_for,
        })
    }

    /// Adds approval gates: a batch with a call to any of these tools needs a human
    /// approval bound to its digest. Names that are not (yet) known tools are kept.
    #[must_use]
    pub fn with_approval_gates(mut self, tools: impl IntoIterator<Item = String>) -> ToolPolicy {
        self.require_approval_for.extend(tools);
        self
    }

    /// Judges a batch of calls under `policies` (the request's profile's).
    ///
    /// Every problem is collected (not just the first), so the model can fix them all
    /// in one repair turn; structural and schema problems first, and only a batch free of
    /// them is put to the policies, one decision per call. A call they refuse gets a
    /// PERMISSION_DENIED violation naming the deciding policies; a call they gate needs
    /// an approval like a call to a gated tool. Budgets are not checked here: the engine
    /// checks the token and tool-call budgets before it asks policy, and stops with its
    /// own terminal reasons.
    ///
    /// # Errors
    ///
    /// [`PolicyError::InvalidRequest`] for a missing `invocation_id`, more than
    /// [`MAX_CALLS`] calls, or arguments over [`MAX_ARGUMENTS_BYTES`].
    pub fn evaluate(
        &self,
        request: &Proposal<'_>,
        policies: &ProfilePolicies,
    ) -> Result<Judgement, PolicyError> {
        check_invocation_id(request.invocation_id)?;
        if request.calls.len() > MAX_CALLS {
            return Err(PolicyError::InvalidRequest(format!(
                "the batch has {} calls; at most {MAX_CALLS} are allowed",
                request.calls.len()
            )));
        }
        if let Some(call) = request
            .calls
            .iter()
            .find(|call| call.arguments_json.len() > MAX_ARGUMENTS_BYTES)
        {
            return Err(PolicyError::InvalidRequest(format!(
                "the arguments of call {:?} are {} bytes; at most {MAX_ARGUMENTS_BYTES} are allowed",
                call.call_id.as_str(),
                call.arguments_json.len()
            )));
        }

        let mut violations = Vec::new();
        if request.calls.is_empty() {
            violations.push(batch_violation("the tool-call batch is empty".into()));
        }
        let mut seen = HashSet::new();
        let mut parsed = Vec::with_capacity(request.calls.len());
        for (index, call) in request.calls.iter().enumerate() {
            if call.call_id.as_str().is_empty() {
                violations.push(batch_violation(format!(
                    "call {index} (tool {:?}) has no call ID",
                    call.tool
                )));
            } else if !seen.insert(call.call_id.as_str()) {
                violations.push(batch_violation(format!(
                    "call ID {:?} is used more than once",
                    call.call_id.as_str()
                )));
            }
            parsed.push(self.check_call(call, &mut violations));
        }
        if !violations.is_empty() {
            return Ok(deny(violations, None));
        }

        // Every call parsed, so `parsed` has one entry per call.
        let parsed: Vec<Value> = parsed.into_iter().flatten().collect();
        let digest = || {
            let canonical: Vec<String> = parsed.iter().map(canonical_json).collect();
            Fingerprint::of_calls(
                request
                    .calls
                    .iter()
                    .zip(&canonical)
                    .map(|(call, args)| (call.tool.as_str(), args.as_str())),
            )
        };
        // Approved: a human approved exactly these calls.
        let approved = request
            .approved
            .is_some_and(|approved| approved == digest());
        let Authorized {
            refused: decisions,
            permits,
            version,
        } = authorize(request, &parsed, approved, policies);
        let mut gated: Vec<Refusal> = Vec::new();
        for (call, decision) in request.calls.iter().zip(&decisions) {
            match decision {
                Some(Judged {
                    effect: Effect::Deny,
                    violation,
                }) => violations.push(violation.clone()),
                Some(Judged {
                    effect: Effect::RequireApproval,
                    violation,
                }) => gated.push(violation.clone()),
                Some(Judged {
                    effect: Effect::Allow,
                    ..
                })
                | None => {}
            }
            if self.require_approval_for.contains(&call.tool)
                && !gated.iter().any(|v| v.call_id == call.call_id)
            {
                gated.push(Refusal {
                    call_id: call.call_id.clone(),
                    error_type: ErrorType::PermissionDenied,
                    message: format!("calls to {} need a human approval", call.tool),
                    policies: Vec::new(),
                });
            }
        }
        if !violations.is_empty() {
            return Ok(deny(violations, version));
        }
        if !gated.is_empty() && !approved {
            // Why, per gated call: what the approver and the model are told.
            return Ok(Judgement {
                ruling: Ruling::RequireApproval,
                violations: gated,
                proposal: Some(digest()),
                policy: version,
                permits,
            });
        }
        Ok(Judgement {
            ruling: Ruling::Allow,
            violations: Vec::new(),
            proposal: None,
            policy: version,
            permits,
        })
    }

    /// [`ToolPolicy::evaluate`] of a request as it came over the wire, answered the
    /// same way: the API's path, and the tests'.
    ///
    /// # Errors
    ///
    /// As [`ToolPolicy::evaluate`].
    pub fn evaluate_request(
        &self,
        request: EvaluateRequest,
        policies: &ProfilePolicies,
    ) -> Result<EvaluateResponse, PolicyError> {
        let calls: Vec<ToolCall> = request
            .calls
            .into_iter()
            .map(agentloop_wire::tool_call_from)
            .collect();
        let proposal = Proposal {
            invocation_id: &request.invocation_id,
            turn: request.turn,
            profile: &request.profile,
            principal: Principal {
                actor: &request.actor,
                tenant: &request.tenant,
                roles: &request.roles,
            },
            calls: &calls,
            // A digest that does not parse approves nothing, as one that does not match.
            approved: request.approved_proposal_digest.parse().ok(),
        };
        self.evaluate(&proposal, policies)
            .map(agentloop_wire::evaluate_response)
    }

    /// Checks one call's tool and arguments, pushing violations; returns the arguments
    /// when they parse as an object.
    fn check_call(&self, call: &ToolCall, violations: &mut Vec<Refusal>) -> Option<Value> {
        let violation = |message: String| Refusal {
            call_id: call.call_id.clone(),
            error_type: ErrorType::InvalidArguments,
            message,
            policies: Vec::new(),
        };
        let tool = self.tools.get(&call.tool);
        if tool.is_none() {
            violations.push(violation(format!("unknown tool {:?}", call.tool)));
        }
        let value: Value = match serde_json::from_str(&call.arguments_json) {
            Ok(value) => value,
            Err(e) => {
                violations.push(violation(format!("arguments are not valid JSON: {e}")));
                return None;
            }
        };
        if !value.is_object() {
            violations.push(violation(format!(
                "arguments must be a JSON object, not {}",
                json_kind(&value)
            )));
            return None;
        }
        if let Some(tool) = tool {
            let mut errors = tool.validator.iter_errors(&value);
            for error in errors.by_ref().take(MAX_SCHEMA_VIOLATIONS_PER_CALL) {
                let path = error.instance_path().as_str().to_owned();
                let at = if path.is_empty() {
                    "/".to_owned()
                } else {
                    path
                };
                violations.push(violation(format!("arguments at {at}: {error}")));
            }
            if errors.next().is_some() {
                violations.push(violation(format!(
                    "more schema violations not shown (at most {MAX_SCHEMA_VIOLATIONS_PER_CALL} per call)"
                )));
            }
        }
        Some(value)
    }
}

/// One call's decision, as the violation it gives when it is not a plain allow.
struct Judged {
    effect: Effect,
    violation: Refusal,
}

/// What the policies said of a batch.
struct Authorized {
    /// Per call, why it may not run as it is (none: it may, or authorization is off).
    refused: Vec<Option<Judged>>,
    /// The policies that permitted each allowed call.
    permits: Vec<Permit>,
    /// The version of the set that decided (none when authorization is off).
    version: Option<String>,
}

/// The policies' decision on each call (none when authorization is off): what refused
/// or gated it, or what permitted it; and the version of the set that decided.
fn authorize(
    request: &Proposal<'_>,
    arguments: &[Value],
    approved: bool,
    policies: &ProfilePolicies,
) -> Authorized {
    let refuse_all = |message: String| {
        let decisions = request
            .calls
            .iter()
            .map(|call| {
                Some(Judged {
                    effect: Effect::Deny,
                    violation: Refusal {
                        call_id: call.call_id.clone(),
                        error_type: ErrorType::PermissionDenied,
                        message: message.clone(),
                        policies: Vec::new(),
                    },
                })
            })
            .collect();
        Authorized {
            refused: decisions,
            permits: Vec::new(),
            version: None,
        }
    };
    let set = match policies {
        ProfilePolicies::Off => {
            return Authorized {
                refused: request.calls.iter().map(|_| None).collect(),
                permits: Vec::new(),
                version: None,
            };
        }
        ProfilePolicies::Missing => {
            return refuse_all(format!(
                "permission denied: no policies are configured for profile {:?}",
                request.profile
            ));
        }
        ProfilePolicies::On(set) => set,
    };
    let batch = BatchContext {
        principal: request.principal,
        profile: request.profile,
        approved,
        turn: request.turn,
    };
    let calls: Vec<CallRequest<'_>> = request
        .calls
        .iter()
        .zip(arguments)
        .map(|(call, arguments)| CallRequest {
            tool: &call.tool,
            arguments,
        })
        .collect();
    let mut permits = Vec::new();
    let refused = set
        .authorize(&batch, &calls)
        .into_iter()
        .zip(request.calls)
        .map(|(decision, call)| {
            if !decision.errors.is_empty() {
                // The policy IDs, not the errors' text: it may quote argument values.
                tracing::warn!(
                    invocation = %request.invocation_id,
                    tool = %call.tool,
                    policies = ?decision.policies,
                    "call denied: it could not be judged (an evaluation error, or arguments Cedar cannot hold)"
                );
            }
            let named = decision.policies.join(", ");
            let message = match decision.effect {
                Effect::RequireApproval if !approved => {
                    format!("calls to {} need a human approval (policy {named})", call.tool)
                }
                // Allowed, or gated and approved by a human: what permitted it is recorded.
                Effect::Allow | Effect::RequireApproval => {
                    permits.push(Permit {
                        call_id: call.call_id.clone(),
                        policies: decision.policies,
                    });
                    return None;
                }
                Effect::Deny if !decision.policies.is_empty() && decision.errors.is_empty() => {
                    format!("permission denied by policy {named}")
                }
                Effect::Deny if !decision.errors.is_empty() => {
                    format!("permission denied: {}", decision.errors.join("; "))
                }
                Effect::Deny => format!("permission denied: no policy permits this call to {}", call.tool),
            };
            Some(Judged {
                effect: decision.effect,
                violation: Refusal {
                    call_id: call.call_id.clone(),
                    error_type: ErrorType::PermissionDenied,
                    message,
                    policies: decision.policies,
                },
            })
        })
        .collect();
    Authorized {
        refused,
        permits,
        version: Some(set.version().to_owned()).filter(|v| !v.is_empty()),
    }
}

fn deny(violations: Vec<Refusal>, policy: Option<String>) -> Judgement {
    Judgement {
        ruling: Ruling::Deny,
        violations,
        proposal: None,
        policy,
        permits: Vec::new(),
    }
}

fn batch_violation(message: String) -> Refusal {
    Refusal {
        call_id: CallId::new(""),
        error_type: ErrorType::InvalidArguments,
        message,
        policies: Vec::new(),
    }
}

pub(crate) fn check_invocation_id(id: &str) -> Result<(), PolicyError> {
    if id.is_empty() {
        return Err(PolicyError::InvalidRequest(
            "invocation_id is required".into(),
        ));
    }
    if id.len() > MAX_INVOCATION_ID_BYTES {
        return Err(PolicyError::InvalidRequest(format!(
            "invocation_id is {} bytes; at most {MAX_INVOCATION_ID_BYTES} are allowed",
            id.len()
        )));
    }
    Ok(())
}
