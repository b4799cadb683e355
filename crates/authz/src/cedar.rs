//! The Cedar engine: loading, validating and evaluating a policy set.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use cedar_policy::{
    Context, Decision, Entities, Entity, EntityId, EntityTypeName, EntityUid, PolicyId, PolicySet,
    Request, ResourceConstraint, RestrictedExpression, Schema, ValidationMode, Validator,
};
use miette::Diagnostic;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::arguments::ArgType;
use crate::{Authorizer, BatchContext, CallDecision, CallRequest, Effect, ToolFacts};

/// The fixed part of the entity model, in Cedar schema syntax: the actor, the tool, the
/// `call` action and its context. The `Arguments` type is generated per tool set.
pub const SCHEMA: &str = include_str!("../../../deploy/policies/agentloop.cedarschema");

/// The annotation that makes a satisfied `permit` grant only with a human approval:
/// `@approval` or `@approval("required")`.
pub const APPROVAL_ANNOTATION: &str = "approval";
/// The annotation that names a policy: `@id("small-transfers")`. Without it a policy is
/// `<file name>#<n>`, its position in the file from 0.
pub const ID_ANNOTATION: &str = "id";
/// Largest policy file read, in bytes.
pub const MAX_POLICY_FILE_BYTES: u64 = 1024 * 1024;

/// One policy file's text, and the name errors and default policy IDs use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// Where it came from (a path, as given).
    pub name: String,
    /// The policies, in Cedar syntax.
    pub text: String,
}

impl Source {
    /// Reads a policy file (at most [`MAX_POLICY_FILE_BYTES`]).
    ///
    /// # Errors
    ///
    /// [`LoadError::Read`] when it cannot be read, is too large or is not UTF-8.
    pub fn read(path: &Path) -> Result<Source, LoadError> {
        let failed = |detail: String| LoadError::Read {
            path: path.to_path_buf(),
            detail,
        };
        let len = std::fs::metadata(path)
            .map_err(|e| failed(e.to_string()))?
            .len();
        if len > MAX_POLICY_FILE_BYTES {
            return Err(failed(format!(
                "{len} bytes; at most {MAX_POLICY_FILE_BYTES} are read"
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
        Ok(Source {
            name: path.display().to_string(),
            text,
        })
    }
}

/// Where a policy set is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The source's name.
    pub file: String,
    /// 1-based line and column, when the engine gave a position.
    pub position: Option<(usize, usize)>,
    /// The policy's ID, when the problem is in one policy.
    pub policy: Option<String>,
    /// What is wrong.
    pub detail: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some((line, column)) = self.position {
            write!(f, ":{line}:{column}")?;
        }
        if let Some(policy) = &self.policy {
            write!(f, ": policy {policy}")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// Why a policy set did not load; nothing of it is used then.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// A policy file cannot be read.
    #[error("cannot read policy file {}: {detail}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// Policies that do not parse or do not validate against the schema, each with its
    /// file, position and policy ID.
    #[error("{}", join(.0))]
    Policies(Vec<Problem>),
    /// The schema with the tools' argument types does not load (a bug, or a tool name
    /// Cedar cannot hold).
    #[error("the policy schema does not load: {0}")]
    Schema(String),
}

impl LoadError {
    /// The problems, when the policies themselves are wrong.
    pub fn problems(&self) -> &[Problem] {
        match self {
            LoadError::Policies(problems) => problems,
            LoadError::Read { .. } | LoadError::Schema(_) => &[],
        }
    }
}

fn join(problems: &[Problem]) -> String {
    let lines: Vec<String> = problems.iter().map(Problem::to_string).collect();
    lines.join("\n")
}

/// A Cedar policy set, validated, with the entity model it was validated against.
pub struct Cedar {
    policies: PolicySet,
    /// Per tool, the policies that can apply to its calls (see [`Slice`]).
    slices: HashMap<String, Slice>,
    /// The permits that grant only with an approval.
    gated: HashSet<PolicyId>,
    /// The `Arguments` record type.
    arguments: ArgType,
    tools: HashMap<String, Entity>,
    actor_type: EntityTypeName,
    action: EntityUid,
    engine: cedar_policy::Authorizer,
    version: String,
    schema_text: String,
    left_out: Vec<String>,
}

impl fmt::Debug for Cedar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cedar")
            .field("version", &self.version)
            .field("policies", &self.policies.policies().count())
            .finish_non_exhaustive()
    }
}

/// The whole schema for `tools`: [`SCHEMA`] and their `Arguments` type. The second part
/// is the argument names left out because two tools type them differently.
pub(crate) fn schema_for(tools: &[ToolFacts<'_>]) -> (String, ArgType, Vec<String>) {
    let schemas: Vec<Value> = tools
        .iter()
        .filter_map(|tool| serde_json::from_str(tool.input_schema).ok())
        .collect();
    let (arguments, conflicts) = ArgType::union(&schemas);
    let mut text = String::with_capacity(SCHEMA.len() + 256);
    text.push_str(SCHEMA);
    text.push_str(
        "\n// Generated from the tools' input schemas: every argument they declare, optional.\n\
         type Arguments = ",
    );
    arguments.render(&mut text);
    text.push_str(";\n");
    (
        text,
        arguments,
        conflicts.into_iter().map(|c| c.name).collect(),
    )
}

impl Cedar {
    /// Loads, checks and compiles the policy files `paths` for `tools`.
    ///
    /// # Errors
    ///
    /// [`LoadError::Read`] for a file that cannot be read, then the errors of
    /// [`Cedar::compile`].
    pub fn load(paths: &[PathBuf], tools: &[ToolFacts<'_>]) -> Result<Cedar, LoadError> {
        let sources = paths
            .iter()
            .map(|path| Source::read(path))
            .collect::<Result<Vec<_>, _>>()?;
        Cedar::compile(&sources, tools)
    }

    /// Parses `sources` into one policy set, names its policies, and validates it
    /// strictly against the schema for `tools`.
    ///
    /// # Errors
    ///
    /// [`LoadError::Policies`] with every problem found: a parse error, a policy that
    /// does not validate (an undeclared attribute, a type error), two policies with one
    /// ID, a template, a misplaced `@approval`.
    pub fn compile(sources: &[Source], tools: &[ToolFacts<'_>]) -> Result<Cedar, LoadError> {
        let (schema_text, arguments, conflicts) = schema_for(tools);
        let (schema, _warnings) = Schema::from_cedarschema_str(&schema_text)
            .map_err(|e| LoadError::Schema(e.to_string()))?;

        let mut problems = Vec::new();
        let mut policies = PolicySet::new();
        let mut gated = HashSet::new();
        // Which source each policy came from, for positions in validation errors.
        let mut origin: BTreeMap<String, usize> = BTreeMap::new();
        for (index, source) in sources.iter().enumerate() {
            let parsed = match PolicySet::from_str(&source.text) {
                Ok(parsed) => parsed,
                Err(errors) => {
                    problems.push(located(source, None, &errors, errors.to_string()));
                    continue;
                }
            };
            if parsed.templates().next().is_some() {
                problems.push(Problem {
                    file: source.name.clone(),
                    position: None,
                    policy: None,
                    detail: "templates are not supported; write static policies".into(),
                });
            }
            let mut named: Vec<_> = parsed.policies().collect();
            // Cedar numbers a file's policies `policy0`, `policy1`, ... in order.
            named.sort_by_key(|policy| cedar_index(policy.id()));
            for (n, policy) in named.into_iter().enumerate() {
                let id = match policy.annotation(ID_ANNOTATION) {
                    Some(id) if !id.is_empty() => id.to_owned(),
                    Some(_) | None => format!("{}#{n}", file_name(&source.name)),
                };
                if let Some(value) = policy.annotation(APPROVAL_ANNOTATION) {
                    if policy.effect() != cedar_policy::Effect::Permit {
                        problems.push(problem(
                            source,
                            &id,
                            "@approval applies to permit policies only",
                        ));
                    } else if !value.is_empty() && value != "required" {
                        problems.push(problem(
                            source,
                            &id,
                            "@approval takes no value or \"required\"",
                        ));
                    } else {
                        gated.insert(PolicyId::new(&id));
                    }
                }
                if origin.insert(id.clone(), index).is_some() {
                    problems.push(problem(source, &id, "this policy ID is used twice"));
                    continue;
                }
                if let Err(error) = policies.add(policy.new_id(PolicyId::new(&id))) {
                    problems.push(problem(source, &id, &error.to_string()));
                }
            }
        }
        if problems.is_empty() {
            let validation = Validator::new(schema).validate(&policies, ValidationMode::Strict);
            for error in validation.validation_errors() {
                let id = error.policy_id().to_string();
                let source = origin.get(&id).and_then(|&i| sources.get(i));
                match source {
                    Some(source) => {
                        problems.push(located(source, Some(id), error, error.to_string()))
                    }
                    None => problems.push(Problem {
                        file: String::new(),
                        position: None,
                        policy: Some(id),
                        detail: error.to_string(),
                    }),
                }
            }
        }
        if !problems.is_empty() {
            return Err(LoadError::Policies(problems));
        }

        let tool_type = type_name("Agentloop::Tool")?;
        let action = EntityUid::from_type_name_and_id(
            type_name("Agentloop::Action")?,
            EntityId::new("call"),
        );
        let slices = tools
            .iter()
            .map(|tool| {
                let slice = slice(&policies, &gated, (&tool_type, tool.name), &action)?;
                Ok((tool.name.to_owned(), slice))
            })
            .collect::<Result<HashMap<_, _>, LoadError>>()?;
        let tools = tools
            .iter()
            .map(|tool| Ok((tool.name.to_owned(), tool_entity(&tool_type, tool)?)))
            .collect::<Result<HashMap<_, _>, LoadError>>()?;
        Ok(Cedar {
            policies,
            slices,
            gated,
            arguments,
            tools,
            actor_type: type_name("Agentloop::Actor")?,
            action,
            engine: cedar_policy::Authorizer::new(),
            version: version_of(sources),
            schema_text,
            left_out: conflicts,
        })
    }

    /// The whole schema the policies were validated against (with `Arguments`).
    pub fn schema(&self) -> &str {
        &self.schema_text
    }

    /// Argument names left out of `Arguments` because two tools type them differently:
    /// policies cannot read them.
    pub fn left_out(&self) -> &[String] {
        &self.left_out
    }

    /// The IDs of the loaded policies, sorted.
    pub fn policy_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .policies
            .policies()
            .map(|p| p.id().to_string())
            .collect();
        ids.sort();
        ids
    }

    fn decide<'e>(
        &self,
        batch: &BatchContext<'_>,
        entities: &dyn Fn() -> Result<&'e Entities, String>,
        principal: &EntityUid,
        call: &CallRequest<'_>,
    ) -> CallDecision {
        let (Some(tool), Some(slice)) = (self.tools.get(call.tool), self.slices.get(call.tool))
        else {
            return CallDecision::refused(format!("unknown tool {:?}", call.tool));
        };
        let arguments = match self.arguments.express(call.arguments, &mut String::new()) {
            Ok(arguments) => arguments,
            Err(error) => {
                return CallDecision::refused(format!("the arguments cannot be judged: {error}"));
            }
        };
        if let Some(policies) = &slice.always {
            return CallDecision {
                effect: Effect::Allow,
                policies: policies.clone(),
                errors: Vec::new(),
            };
        }
        let entities = match entities() {
            Ok(entities) => entities,
            Err(error) => {
                return CallDecision::refused(format!("the actor cannot be judged: {error}"));
            }
        };
        let context = Context::from_pairs([
            (
                "tenant".to_owned(),
                RestrictedExpression::new_string(batch.principal.tenant.to_owned()),
            ),
            (
                "profile".to_owned(),
                RestrictedExpression::new_string(batch.profile.to_owned()),
            ),
            ("arguments".to_owned(), arguments),
            (
                "approved".to_owned(),
                RestrictedExpression::new_bool(batch.approved),
            ),
            (
                "turn".to_owned(),
                RestrictedExpression::new_long(i64::from(batch.turn)),
            ),
        ]);
        let request = context.map_err(|e| e.to_string()).and_then(|context| {
            Request::new(
                principal.clone(),
                self.action.clone(),
                tool.uid(),
                context,
                None,
            )
            .map_err(|e| e.to_string())
        });
        let request = match request {
            Ok(request) => request,
            Err(error) => {
                return CallDecision::refused(format!("the call cannot be judged: {error}"));
            }
        };
        let response = self
            .engine
            .is_authorized(&request, &slice.policies, entities);
        let errors: Vec<(String, String)> = response
            .diagnostics()
            .errors()
            .map(|error| {
                let cedar_policy::AuthorizationError::PolicyEvaluationError(error) = error;
                (error.policy_id().to_string(), error.to_string())
            })
            .collect();
        if !errors.is_empty() {
            // A policy that cannot be evaluated might have been the forbid: deny.
            let (policies, errors) = errors.into_iter().unzip();
            return CallDecision {
                effect: Effect::Deny,
                policies,
                errors,
            };
        }
        let mut policies: Vec<&PolicyId> = response.diagnostics().reason().collect();
        let effect = match response.decision() {
            Decision::Deny => Effect::Deny,
            Decision::Allow if policies.iter().any(|id| self.gated.contains(*id)) => {
                policies.retain(|id| self.gated.contains(*id));
                Effect::RequireApproval
            }
            Decision::Allow => Effect::Allow,
        };
        let mut policies: Vec<String> = policies.into_iter().map(ToString::to_string).collect();
        policies.sort();
        CallDecision {
            effect,
            policies,
            errors: Vec::new(),
        }
    }
}

impl Authorizer for Cedar {
    fn version(&self) -> &str {
        &self.version
    }

    fn authorize(&self, batch: &BatchContext<'_>, calls: &[CallRequest<'_>]) -> Vec<CallDecision> {
        let principal = EntityUid::from_type_name_and_id(
            self.actor_type.clone(),
            EntityId::new(batch.principal.actor),
        );
        // One entity store for the batch, the actor and each tool called, built only if
        // a call needs an evaluation.
        let entities = std::cell::OnceCell::new();
        let entities = || {
            entities
                .get_or_init(|| {
                    let mut seen = HashSet::new();
                    let tools = calls
                        .iter()
                        .filter(|call| seen.insert(call.tool))
                        .filter_map(|call| self.tools.get(call.tool).cloned());
                    let actor =
                        Entity::new(principal.clone(), actor_attributes(batch), HashSet::new())
                            .map_err(|e| e.to_string())?;
                    Entities::from_entities(std::iter::once(actor).chain(tools), None)
                        .map_err(|e| e.to_string())
                })
                .as_ref()
                .map_err(Clone::clone)
        };
        calls
            .iter()
            .map(|call| self.decide(batch, &entities, &principal, call))
            .collect()
    }
}

/// The policies that can apply to the calls of one tool. Cedar evaluates every policy it
/// is given, so a call costs only the policies about its tool.
struct Slice {
    policies: PolicySet,
    /// Set when every policy of the slice is a `permit` without conditions or approval
    /// whose scope matches every call of the tool: the decision is always allow, by
    /// these (sorted) IDs, and needs no evaluation.
    always: Option<Vec<String>>,
}

/// The slice of `set` for `tool` (the tool type and the tool's name); `call` is the
/// action. A scope `resource ==` or `resource in` a tool applies to that tool alone
/// (tools have no parents); any other scope applies to every tool.
fn slice(
    set: &PolicySet,
    gated: &HashSet<PolicyId>,
    (tool_type, tool): (&EntityTypeName, &str),
    call: &EntityUid,
) -> Result<Slice, LoadError> {
    let names_this = |uid: &EntityUid| uid.type_name() == tool_type && uid.id().unescaped() == tool;
    let applies = |policy: &cedar_policy::Policy| match policy.resource_constraint() {
        ResourceConstraint::Eq(uid)
        | ResourceConstraint::In(uid)
        | ResourceConstraint::IsIn(_, uid)
            if uid.type_name() == tool_type =>
        {
            names_this(&uid)
        }
        ResourceConstraint::Any
        | ResourceConstraint::Eq(_)
        | ResourceConstraint::In(_)
        | ResourceConstraint::IsIn(..)
        | ResourceConstraint::Is(_) => true,
    };
    let policies = PolicySet::from_policies(set.policies().filter(|p| applies(p)).cloned())
        .map_err(|e| LoadError::Schema(e.to_string()))?;
    let unconditional = |policy: &cedar_policy::Policy| {
        let resource = match policy.resource_constraint() {
            ResourceConstraint::Any => true,
            ResourceConstraint::Eq(uid) | ResourceConstraint::In(uid) => names_this(&uid),
            ResourceConstraint::IsIn(..) | ResourceConstraint::Is(_) => false,
        };
        let action = match policy.action_constraint() {
            cedar_policy::ActionConstraint::Any => true,
            cedar_policy::ActionConstraint::Eq(uid) => &uid == call,
            cedar_policy::ActionConstraint::In(_) => false,
        };
        let conditions = policy.to_json().ok().and_then(|json| {
            json.get("conditions")
                .and_then(Value::as_array)
                .map(Vec::is_empty)
        });
        policy.effect() == cedar_policy::Effect::Permit
            && !gated.contains(policy.id())
            && matches!(
                policy.principal_constraint(),
                cedar_policy::PrincipalConstraint::Any
            )
            && action
            && resource
            && conditions == Some(true)
    };
    let always = (policies.policies().next().is_some() && policies.policies().all(unconditional))
        .then(|| {
            let mut ids: Vec<String> = policies.policies().map(|p| p.id().to_string()).collect();
            ids.sort();
            ids
        });
    Ok(Slice { policies, always })
}

fn actor_attributes(batch: &BatchContext<'_>) -> HashMap<String, RestrictedExpression> {
    let roles = batch
        .principal
        .roles
        .iter()
        .map(|role| RestrictedExpression::new_string(role.clone()));
    HashMap::from([
        (
            "tenant".to_owned(),
            RestrictedExpression::new_string(batch.principal.tenant.to_owned()),
        ),
        ("roles".to_owned(), RestrictedExpression::new_set(roles)),
    ])
}

fn type_name(name: &str) -> Result<EntityTypeName, LoadError> {
    EntityTypeName::from_str(name).map_err(|e| LoadError::Schema(e.to_string()))
}

fn tool_entity(tool_type: &EntityTypeName, tool: &ToolFacts<'_>) -> Result<Entity, LoadError> {
    let uid = EntityUid::from_type_name_and_id(tool_type.clone(), EntityId::new(tool.name));
    Entity::new(
        uid,
        HashMap::from([
            (
                "side_effect".to_owned(),
                RestrictedExpression::new_string(tool.side_effect.to_owned()),
            ),
            (
                "requires_approval".to_owned(),
                RestrictedExpression::new_bool(tool.requires_approval),
            ),
        ]),
        HashSet::new(),
    )
    .map_err(|e| LoadError::Schema(e.to_string()))
}

/// The version a policy set compiled from `sources` has: a digest of their file names
/// and texts, in order.
pub fn version_of(sources: &[Source]) -> String {
    let mut hash = Sha256::new();
    for source in sources {
        hash.update(file_name(&source.name).as_bytes());
        hash.update([0]);
        hash.update(source.text.as_bytes());
        hash.update([0]);
    }
    hex::encode(&hash.finalize()[..16])
}

/// `policy7` → 7: Cedar's own numbering of a file's policies.
fn cedar_index(id: &PolicyId) -> usize {
    id.to_string()
        .strip_prefix("policy")
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX)
}

fn file_name(name: &str) -> &str {
    Path::new(name)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(name)
}

fn problem(source: &Source, policy: &str, detail: &str) -> Problem {
    Problem {
        file: source.name.clone(),
        position: None,
        policy: Some(policy.to_owned()),
        detail: detail.to_owned(),
    }
}

/// A problem at the first labelled position of `diagnostic` in `source`.
fn located(
    source: &Source,
    policy: Option<String>,
    diagnostic: &dyn Diagnostic,
    detail: String,
) -> Problem {
    let offset = diagnostic
        .labels()
        .and_then(|mut labels| labels.next())
        .map(|label| label.offset());
    Problem {
        file: source.name.clone(),
        position: offset.map(|offset| line_column(&source.text, offset)),
        policy,
        detail,
    }
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = r#"{"type": "object", "properties": {"key": {"type": "string"}}}"#;

    fn always(text: &str, tool: &str) -> Option<Vec<String>> {
        let tools = [ToolFacts {
            name: tool,
            side_effect: "read_only",
            requires_approval: false,
            input_schema: SCHEMA,
        }];
        let cedar = Cedar::compile(
            &[Source {
                name: "t.cedar".into(),
                text: text.into(),
            }],
            &tools,
        )
        .unwrap();
        cedar.slices[tool].always.clone()
    }

    #[test]
    fn only_slices_of_unconditional_permits_skip_the_evaluation() {
        let lookup = r#"@id("l") permit(principal, action == Agentloop::Action::"call", resource == Agentloop::Tool::"lookup");"#;
        assert_eq!(always(lookup, "lookup"), Some(vec!["l".to_owned()]));
        // Another tool's policy is not in the slice at all.
        let other = format!(
            "{lookup}\n@id(\"t\") permit(principal, action, resource == Agentloop::Tool::\"transfer\") when {{ context.turn > 1 }};"
        );
        assert_eq!(always(&other, "lookup"), Some(vec!["l".to_owned()]));
        for spoiler in [
            "forbid(principal, action, resource) when { context.turn > 9 };",
            "permit(principal, action, resource) when { context.turn > 9 };",
            "@approval permit(principal, action, resource);",
            "permit(principal == Agentloop::Actor::\"ana\", action, resource);",
            "permit(principal, action, resource is Agentloop::Tool);",
        ] {
            assert_eq!(
                always(&format!("{lookup}\n{spoiler}"), "lookup"),
                None,
                "{spoiler}"
            );
        }
        assert_eq!(
            always(
                "forbid(principal, action, resource == Agentloop::Tool::\"x\");",
                "lookup"
            ),
            None,
            "an empty slice denies"
        );
    }
}
