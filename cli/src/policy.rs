//! `agentloop policy`: the authoring tools for the Cedar policies that authorize tool
//! calls. `validate` loads policy files as one set, `check` judges one call against a
//! set, `schema` prints the entity model the policies are written against.
//!
//! Each goes through the policy service's own code ([`agentloop_policy::compile_policies`]
//! for the same tools, then [`agentloop_authz::Authorizer`]), so a set that validates
//! here loads in the service, and a decision printed here is the one the service makes
//! for the same actor, tenant, roles and arguments. Without `--tools` the tools are
//! those an embedded `run` registers without it (the demo executor's).
//!
//! The outputs and the exit codes are a stable format (docs/cli.md): scripts and CI
//! gate on them.

use std::path::PathBuf;

use agentloop_authz::{
    Authorizer, BatchContext, CallDecision, CallRequest, Cedar, Effect, LoadError, Principal,
};
use agentloop_proto::v1::ToolDescriptor;
use agentloop_tools::ToolsConfig;
use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::Value;

use crate::exit;

/// The `policy` subcommands.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Loads Cedar policy files as one set for the tools, as the policy service would,
    /// and prints every problem (`file:line:col: policy ID: detail`).
    #[command(after_help = "Exit codes: 0 the set loads; 78 it does not; 1 the tools do not load.")]
    Validate(ValidateArgs),
    /// Prints the decision on one tool call (`allow`, `require_approval` or `deny`) and
    /// the policies that decided it.
    #[command(after_help = "Exit codes: 0 allow; 3 require_approval; 4 deny; \
                            78 the policies do not load; 2 bad usage (an unknown --tool, \
                            --args not a JSON object); 1 the tools do not load.")]
    Check(CheckArgs),
    /// Prints the whole Cedar schema the policies are validated against, with the
    /// `Arguments` type generated from the tools' input schemas.
    Schema(SchemaArgs),
}

/// The tools the policies are for.
#[derive(Debug, Args)]
pub struct ToolsArg {
    /// Tools config (TOML); without it the demo executor's tools, as for `run`.
    #[arg(long, value_name = "FILE")]
    tools: Option<PathBuf>,
}

/// `policy validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The policy files, loaded as one set (as a profile's files are).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    #[command(flatten)]
    tools: ToolsArg,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `policy check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// A policy file; repeat for several, loaded as one set.
    #[arg(long = "policies", value_name = "FILE", required = true)]
    policies: Vec<PathBuf>,
    #[command(flatten)]
    tools: ToolsArg,
    /// The actor the call is made for (the token's `sub`).
    #[arg(long)]
    actor: String,
    /// The actor's tenant.
    #[arg(long)]
    tenant: String,
    /// The actor's roles: `--roles clerk,approver` or `--roles clerk --roles approver`.
    #[arg(long, value_name = "ROLE", value_delimiter = ',')]
    roles: Vec<String>,
    /// The tool called, by name.
    #[arg(long, value_name = "NAME")]
    tool: String,
    /// The call's arguments: a JSON object.
    #[arg(long = "args", value_name = "JSON", value_parser = json_object)]
    arguments: Value,
    /// A human approved the call's batch (`context.approved`).
    #[arg(long)]
    approved: bool,
    /// The invocation's profile (`context.profile`).
    #[arg(long, default_value = "default")]
    profile: String,
    /// The turn of the call, from 1 (`context.turn`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    turn: u32,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `policy schema`.
#[derive(Debug, Args)]
pub struct SchemaArgs {
    #[command(flatten)]
    tools: ToolsArg,
}

/// Runs a `policy` subcommand; the exit code is the result.
///
/// # Errors
///
/// When the tools cannot be loaded; policies that do not load are an exit code
/// ([`exit::BAD_CONFIG`]), not an error.
pub fn run(command: PolicyCommand) -> anyhow::Result<u8> {
    match command {
        PolicyCommand::Validate(args) => validate(&args),
        PolicyCommand::Check(args) => check(&args),
        PolicyCommand::Schema(args) => schema(&args),
    }
}

/// `--args` is parsed by clap, so a value that is not an object is clap's usage error.
fn json_object(text: &str) -> Result<Value, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(_) => {
            Err("not a JSON object; the arguments are one, e.g. '{\"key\": \"profile\"}'".into())
        }
        Err(error) => Err(format!("not JSON: {error}")),
    }
}

/// The descriptors of the registry at `path`, or of the demo tools an embedded `run`
/// registers without one.
fn descriptors(tools: &ToolsArg) -> anyhow::Result<Vec<ToolDescriptor>> {
    let registry = match &tools.tools {
        Some(path) => ToolsConfig::load(path)?,
        None => agentloop_stack::demo_tools()?,
    };
    Ok(registry.descriptors())
}

/// Argument names the policies cannot read: said on stderr, since a policy that needs
/// one fails validation with a message that does not say why the argument is missing.
fn warn_left_out(cedar: &Cedar) {
    if !cedar.left_out().is_empty() {
        eprintln!(
            "agentloop: warning: the tools type these arguments differently, so policies cannot read them: {}",
            cedar.left_out().join(", ")
        );
    }
}

/// One problem of a set that does not load, as `validate --json` prints it.
#[derive(Debug, Serialize)]
struct ProblemView {
    file: String,
    line: Option<usize>,
    column: Option<usize>,
    policy: Option<String>,
    detail: String,
}

fn problem_views(error: &LoadError) -> Vec<ProblemView> {
    if let LoadError::Read { path, detail } = error {
        return vec![ProblemView {
            file: path.display().to_string(),
            line: None,
            column: None,
            policy: None,
            detail: format!("cannot read it: {detail}"),
        }];
    }
    if error.problems().is_empty() {
        // The schema itself does not load (a tool name Cedar cannot hold): no file.
        return vec![ProblemView {
            file: String::new(),
            line: None,
            column: None,
            policy: None,
            detail: error.to_string(),
        }];
    }
    error
        .problems()
        .iter()
        .map(|problem| ProblemView {
            file: problem.file.clone(),
            line: problem.position.map(|(line, _)| line),
            column: problem.position.map(|(_, column)| column),
            policy: problem.policy.clone(),
            detail: problem.detail.clone(),
        })
        .collect()
}

fn validate(args: &ValidateArgs) -> anyhow::Result<u8> {
    let descriptors = descriptors(&args.tools)?;
    match agentloop_policy::compile_policies(&args.files, &descriptors) {
        Ok(cedar) => {
            warn_left_out(&cedar);
            let ids = cedar.policy_ids();
            if args.json {
                let json =
                    serde_json::json!({"ok": true, "policies": ids, "version": cedar.version()});
                println!("{json}");
            } else {
                let noun = if ids.len() == 1 { "policy" } else { "policies" };
                println!("ok: {} {noun}, version {}", ids.len(), cedar.version());
            }
            Ok(0)
        }
        Err(error) => {
            if args.json {
                let json = serde_json::json!({"ok": false, "problems": problem_views(&error)});
                println!("{json}");
            } else {
                // One problem a line: `file:line:col: policy ID: detail`.
                println!("{error}");
            }
            Ok(exit::BAD_CONFIG)
        }
    }
}

/// `check`'s verdict as its exit code: a script can gate on it without parsing.
fn effect_code(effect: Effect) -> u8 {
    match effect {
        Effect::Allow => 0,
        Effect::RequireApproval => exit::POLICY_REQUIRE_APPROVAL,
        Effect::Deny => exit::POLICY_DENY,
    }
}

fn effect_name(effect: Effect) -> &'static str {
    match effect {
        Effect::Allow => "allow",
        Effect::RequireApproval => "require_approval",
        Effect::Deny => "deny",
    }
}

/// A usage error in clap's format, for what only the loaded tools can tell.
fn usage(message: String) -> u8 {
    let mut command = CheckArgs::augment_args(clap::Command::new("agentloop policy check"));
    let _ = command
        .error(clap::error::ErrorKind::InvalidValue, message)
        .print();
    exit::USAGE
}

fn check(args: &CheckArgs) -> anyhow::Result<u8> {
    let descriptors = descriptors(&args.tools)?;
    if !descriptors.iter().any(|tool| tool.name == args.tool) {
        let known: Vec<&str> = descriptors.iter().map(|tool| tool.name.as_str()).collect();
        let known = if known.is_empty() {
            "no tools are registered".to_owned()
        } else {
            format!("the tools are {}", known.join(", "))
        };
        return Ok(usage(format!(
            "invalid value '{}' for '--tool <NAME>': no such tool; {known}",
            args.tool
        )));
    }
    let cedar = match agentloop_policy::compile_policies(&args.policies, &descriptors) {
        Ok(cedar) => cedar,
        Err(error) => {
            // Not the decision asked for: stderr, in both formats.
            eprintln!("agentloop: the policies do not load:\n{error}");
            return Ok(exit::BAD_CONFIG);
        }
    };
    warn_left_out(&cedar);
    let roles: Vec<String> = args
        .roles
        .iter()
        .filter(|role| !role.is_empty())
        .cloned()
        .collect();
    let batch = BatchContext {
        principal: Principal {
            actor: &args.actor,
            tenant: &args.tenant,
            roles: &roles,
        },
        profile: &args.profile,
        approved: args.approved,
        turn: args.turn,
    };
    let call = CallRequest {
        tool: &args.tool,
        arguments: &args.arguments,
    };
    let Some(decision) = cedar.authorize(&batch, &[call]).into_iter().next() else {
        anyhow::bail!("the authorizer gave no decision for the call");
    };
    if args.json {
        let json = serde_json::json!({
            "decision": effect_name(decision.effect),
            "policies": decision.policies,
            "errors": decision.errors,
            "version": cedar.version(),
        });
        println!("{json}");
    } else {
        print!("{}", decision_text(&decision));
    }
    Ok(effect_code(decision.effect))
}

/// The decision, then `policies: ...` when policies decided it, then one `error: ...`
/// line per error.
fn decision_text(decision: &CallDecision) -> String {
    let mut text = format!("{}\n", effect_name(decision.effect));
    if !decision.policies.is_empty() {
        text.push_str(&format!("policies: {}\n", decision.policies.join(", ")));
    } else if decision.effect == Effect::Deny && decision.errors.is_empty() {
        // Cedar denies by default: say so, rather than print a denial with no reason.
        text.push_str("no policy permits this call\n");
    }
    for error in &decision.errors {
        text.push_str(&format!("error: {error}\n"));
    }
    text
}

fn schema(args: &SchemaArgs) -> anyhow::Result<u8> {
    let descriptors = descriptors(&args.tools)?;
    // The schema is built with a set; an empty one has nothing to fail validation.
    match Cedar::compile(&[], &agentloop_policy::tool_facts(&descriptors)) {
        Ok(cedar) => {
            warn_left_out(&cedar);
            print!("{}", cedar.schema());
            Ok(0)
        }
        Err(error) => {
            eprintln!("agentloop: {error}");
            Ok(exit::BAD_CONFIG)
        }
    }
}
