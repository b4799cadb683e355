//! `agentloop`: run the loop embedded with one command, or drive a deployed orchestrator.
//!
//! Exit codes: 0 `completed`; one code per other terminal reason (docs/cli.md); 1 for a
//! failure outside any invocation; 2 for bad usage; `policy check`'s verdicts 3 and 4.

#![allow(
    clippy::print_stdout,
    reason = "a command line prints its results on stdout"
)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::client::{self, RunOptions};
use agentloop::{effects, exit, humans, policy};
use agentloop_bench as bench;
use agentloop_decision::cassette;
use agentloop_proto::v1 as pb;
use agentloop_stack::StackOptions;
use agentloop_tools::ToolsConfig;
use clap::{Args, Parser, Subcommand};
use embedded::{Embedded, HttpAt, HttpFlag, MetricsAt, Serving};

mod embedded;
mod eval;
mod mcp;
mod model;
mod replay;

/// Where the embedded default keeps its data, unless told otherwise.
const DEFAULT_DATA_DIR: &str = ".agentloop";

/// Many small, short-lived allocations cross threads in every turn; glibc's allocator
/// made them a sixth of a turn's CPU (`agentloop bench`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "agentloop",
    version,
    about = "Runs AI-agent tasks as bounded, durable loops"
)]
struct Cli {
    /// Where the embedded default keeps its data (event store, ledger, demo executor).
    #[arg(
        long,
        global = true,
        env = "AGENTLOOP_DATA_DIR",
        default_value = DEFAULT_DATA_DIR
    )]
    data_dir: PathBuf,
    /// The caller's token (a JWT) for an orchestrator that authenticates its callers;
    /// sent by the commands that call one (`--server`, `cancel`).
    #[arg(long, global = true, env = "AGENTLOOP_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs every service in this process over the embedded store; the port serves the
    /// orchestrator's API.
    Dev {
        /// Address to serve on.
        #[arg(long, default_value = "127.0.0.1:50051")]
        listen: SocketAddr,
        /// Tools config (TOML); without it the demo executor's tools are registered.
        #[arg(long)]
        tools: Option<PathBuf>,
        /// The orchestrator's configuration file (TOML: `[auth]`, `[limits]`, `[tenants]`,
        /// `[telemetry]`, ...), layered under `AGENTLOOP_ORCHESTRATOR_*` variables as the
        /// orchestrator's [env: AGENTLOOP_ORCHESTRATOR_CONFIG].
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Serve Prometheus `/metrics` on this address (the configuration's
        /// `metrics_listen`).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<SocketAddr>,
        /// Also serve the API as HTTP/JSON on this address, or `off`; without it, the
        /// configuration's `http_listen`, else 127.0.0.1:50080.
        #[arg(long, value_name = "ADDR|off")]
        http: Option<HttpFlag>,
        /// Listen beyond loopback without authentication (no `[auth]`): anyone who
        /// reaches the port acts as any tenant.
        #[arg(long)]
        insecure_no_auth: bool,
        /// Cedar policy files authorizing every call of the default profile (reloaded
        /// when they change); without them, authorization is off.
        #[arg(long = "policies", value_name = "FILE")]
        policies: Vec<PathBuf>,
        /// The default profile's acceptance rules of final answers (TOML: the keys of
        /// one `[acceptance.<profile>]` table).
        #[arg(long, value_name = "FILE")]
        acceptance: Option<PathBuf>,
        /// The model of the invocations started without a script of their own (an A2A
        /// client's tasks, the console's, the API's): `openai:MODEL` or
        /// `anthropic:MODEL`. Without it (and without `--script`) they end `model_error`.
        #[arg(long, value_name = "SPEC", conflicts_with = "script")]
        model: Option<String>,
        /// The price of `--model` in US dollars per million input and output tokens.
        #[arg(long, value_name = "INPUT,OUTPUT", requires = "model")]
        price: Option<agentloop_decision::Price>,
        /// A scripted model (JSON) for the invocations started without a script of their
        /// own: each replays it from its first turn.
        #[arg(long, value_name = "FILE")]
        script: Option<PathBuf>,
    },
    /// Starts an invocation with a scripted model or a real one and follows it to its end.
    Run(RunArgs),
    /// Runs a suite of evaluation cases, each embedded on a stack of its own, and judges
    /// every run by its trajectory, its effects and its end; prints a verdict per run and
    /// the aggregate. Exits 0 when every run passed (or `--min-pass-rate` was reached),
    /// 1 otherwise, 2 for a suite that cannot be read.
    Eval {
        /// Case files, and folders of them (`*.json`, in subfolders too; `*.script.json`
        /// files are scripts the cases name).
        #[arg(required_unless_present = "schema")]
        suites: Vec<PathBuf>,
        /// Prints the JSON Schema of a case file, and exits.
        #[arg(long, conflicts_with = "suites")]
        schema: bool,
        /// The verdicts and the aggregate as one JSON document.
        #[arg(long)]
        json: bool,
        /// Also writes a JUnit XML report here.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// Exits 0 when at least this share of the runs passed (0 to 1).
        #[arg(long, value_name = "RATE", value_parser = parse_rate)]
        min_pass_rate: Option<f64>,
        /// Runs at once.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
        jobs: u16,
        /// A running orchestrator to run every case on (with `--token` if it
        /// authenticates); cases that name tools, policies, acceptance rules, a cassette or
        /// faults need the embedded stack and are refused.
        #[arg(long)]
        server: Option<String>,
    },
    /// Judges committed invocations of the data directory again under today's tools,
    /// policies and acceptance rules, without running a tool or writing anything: which
    /// calls would now be refused or need approval, which refused ones would now run,
    /// which accepted answers would now fail. A dry run of a policy change over real
    /// history.
    Replay {
        /// The invocations.
        #[arg(required_unless_present = "all")]
        ids: Vec<String>,
        /// Every invocation instead, newest first (at most `--limit`).
        #[arg(long, conflicts_with = "ids")]
        all: bool,
        /// With `--all`: only those created within this long before now (`24h`, `7d`
        /// is `168h`).
        #[arg(long, requires = "all", value_parser = client::parse_duration)]
        since: Option<std::time::Duration>,
        /// With `--all`: the most invocations replayed.
        #[arg(long, default_value_t = 1_000, requires = "all",
              value_parser = clap::value_parser!(u32).range(1..=100_000))]
        limit: u32,
        /// The tools config (TOML) to judge against; without it the demo executor's.
        #[arg(long)]
        tools: Option<PathBuf>,
        /// The Cedar policy files to judge against (the default profile's).
        #[arg(long = "policies", value_name = "FILE")]
        policies: Vec<PathBuf>,
        /// The acceptance rules to check final answers against (the default profile's).
        #[arg(long, value_name = "FILE")]
        acceptance: Option<PathBuf>,
        /// A deployment's PostgreSQL database of events (the orchestrators'
        /// `database_url`) instead of the data directory's.
        #[arg(long, value_name = "URL", env = "AGENTLOOP_REPLAY_DATABASE_URL")]
        database_url: Option<String>,
        /// Its ledger's database (the ledger's `database_url`); without it, the events'
        /// database, which the ledger shares in the production overlay.
        #[arg(
            long,
            value_name = "URL",
            requires = "database_url",
            env = "AGENTLOOP_REPLAY_LEDGER_DATABASE_URL"
        )]
        ledger_database_url: Option<String>,
        /// One JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Shows an invocation's committed event log as a timeline.
    Show {
        /// The invocation.
        id: String,
        /// A running orchestrator; without it, the embedded data directory is read.
        #[arg(long)]
        server: Option<String>,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Lists invocations, newest first: state, turns, calls and goal.
    List {
        /// A running orchestrator; without it, the embedded one over the data directory.
        #[arg(long)]
        server: Option<String>,
        /// Only invocations in this state.
        #[arg(long, value_enum)]
        state: Option<StateFilter>,
        /// Only invocations that ended (or wait) with this reason, e.g. `completed`,
        /// `approval_required`.
        #[arg(long, value_parser = parse_reason)]
        reason: Option<agentloop_engine::TerminalReason>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Follows an invocation from any process: each event as it commits, then the
    /// summary; the exit code is its terminal reason's. Ctrl-C stops watching and leaves
    /// it running.
    Watch {
        /// The invocation.
        id: String,
        /// A running orchestrator; without it, the embedded one over the data directory.
        #[arg(long)]
        server: Option<String>,
        /// The first event to show (1: from the start).
        #[arg(long, default_value_t = 1)]
        from_seq: u64,
        /// JSON lines instead of text: each event, then the summary.
        #[arg(long)]
        json: bool,
    },
    /// Lists the invocations that wait for a human, with what each waits for and the
    /// command that resumes it.
    Pending {
        /// A running orchestrator; without it, the embedded one over the data directory.
        #[arg(long)]
        server: Option<String>,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Approves (or denies) the proposal an invocation waits for, after showing its exact
    /// calls, then follows the invocation.
    Approve {
        /// The invocation.
        id: String,
        /// Deny: nothing runs, and the model is told (with `--comment`).
        #[arg(long)]
        deny: bool,
        /// Words for the model: why it was denied, what to watch for.
        #[arg(long, default_value = "")]
        comment: String,
        /// Approve only this proposal digest (as `pending` shows it): the calls shown.
        #[arg(long)]
        digest: Option<String>,
        /// Approve without the question a terminal gets.
        #[arg(long)]
        yes: bool,
        /// Who approves, when the orchestrator authenticates nobody (default: $USER);
        /// with `--token`, the token's actor.
        #[arg(long)]
        actor: Option<String>,
        #[command(flatten)]
        reply: ReplyArgs,
    },
    /// Answers the question an invocation waits for, then follows the invocation. A
    /// tool's question (`pending` shows its schema) is answered with a JSON object, or
    /// declined or cancelled.
    Answer {
        /// The invocation.
        id: String,
        /// The answer: words for the model, or for a tool's question the content, a JSON
        /// object satisfying its schema (properties left out take their defaults).
        #[arg(required_unless_present_any = ["decline", "cancel"])]
        text: Option<String>,
        /// Decline a tool's question: the tool is told the person refused.
        #[arg(long, conflicts_with_all = ["text", "cancel"])]
        decline: bool,
        /// Dismiss a tool's question without choosing.
        #[arg(long, conflicts_with = "text")]
        cancel: bool,
        /// Who answers, when the orchestrator authenticates nobody (default: $USER).
        #[arg(long)]
        actor: Option<String>,
        #[command(flatten)]
        reply: ReplyArgs,
    },
    /// Asks a server's gRPC health service (`grpc.health.v1.Health`) for a status:
    /// exits 0 once it answers SERVING. Any agentloop process answers it, without a
    /// token; scripts wait on it for a process to be ready.
    Health {
        /// The server.
        #[arg(long, default_value = "http://127.0.0.1:50051")]
        server: String,
        /// The served service to ask about (`agentloop.v1.OrchestratorService`); the
        /// process's overall status by default.
        #[arg(long, default_value = "")]
        service: String,
        /// Keep asking until it answers SERVING or this long has passed: `30s`.
        #[arg(long, value_parser = client::parse_duration)]
        wait: Option<std::time::Duration>,
    },
    /// Cancels an invocation on a running orchestrator.
    Cancel {
        /// The invocation.
        id: String,
        /// The orchestrator (`agentloop dev` listens on this by default).
        #[arg(long, default_value = "http://127.0.0.1:50051")]
        server: String,
        /// Why, for the log.
        #[arg(long, default_value = "cancelled from the command line")]
        reason: String,
    },
    /// Lists the effect ledger's unresolved entries; `reconciliation_required` ones
    /// wait for an operator, who settles them with `effects settle`.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Effects {
        #[command(subcommand)]
        command: Option<EffectsCommand>,
        /// List the unresolved entries: prepared, dispatched, outcome_unknown and
        /// reconciliation_required (required: the only listing there is).
        #[arg(long, required = true)]
        unresolved: bool,
        /// A running orchestrator (`agentloop dev`'s port); without it, the embedded data
        /// directory is read. With authentication on, --invocation is required.
        #[arg(long)]
        server: Option<String>,
        /// Only this invocation's entries.
        #[arg(long)]
        invocation: Option<String>,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Runs the standard workload (N invocations at once, T turns each, two lookups per
    /// turn) and reports throughput, latency, CPU, memory, storage and fsyncs.
    Bench(BenchArgs),
    /// Runs the cluster with every process on a host of its own (network namespaces),
    /// cuts and disturbs their links on a seeded schedule while a workload of reads and
    /// writes runs, then checks that no write was lost or repeated, no stale worker
    /// committed, and every invocation ended. Needs root, iproute2 and iptables.
    Chaos(ChaosArgs),
    /// Mints a development token (an HS256 JWT) for an orchestrator whose `[auth]` names
    /// the same secret file; production tokens come from your identity provider.
    Token {
        /// The secret file of `auth.hs256_secret_file` (at least 32 bytes).
        #[arg(long)]
        secret_file: PathBuf,
        /// `auth.issuer`.
        #[arg(long)]
        issuer: String,
        /// `auth.audience`.
        #[arg(long, default_value = "agentloop")]
        audience: String,
        /// The actor (`sub`).
        #[arg(long)]
        actor: String,
        /// The tenant (the `tenant` claim).
        #[arg(long)]
        tenant: String,
        /// A role (the `roles` claim); repeat for several, e.g. `--role approver`.
        #[arg(long = "role")]
        roles: Vec<String>,
        /// How long it is valid: `30m`, `8h`.
        #[arg(long, default_value = "1h", value_parser = client::parse_duration)]
        valid_for: std::time::Duration,
    },
    /// Validates Cedar policy files, checks a tool call against them, prints their
    /// schema.
    Policy {
        #[command(subcommand)]
        command: policy::PolicyCommand,
    },
    /// MCP servers of a tool registry: `login` authorizes the gateway for a server that
    /// wants a user's consent.
    Mcp {
        #[command(subcommand)]
        command: McpCommand,
    },
    /// An example end to end: two parallel lookups, then an answer that cites both.
    Demo {
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// What an operator does for an MCP server.
#[derive(Debug, Subcommand)]
enum McpCommand {
    /// Authorizes the gateway for an MCP server whose `[mcp_servers.oauth]` has a
    /// `token_file` (the OAuth authorization code grant): prints a URL to open in a
    /// browser, waits for the authorization server to send the browser back here, and
    /// writes the client and its tokens to the token file, which the gateway then
    /// refreshes alone. The URL goes to stdout, everything else to stderr.
    Login {
        /// The server's `name` in the registry.
        server: String,
        /// The tool registry (TOML) holding the server's entry.
        #[arg(long)]
        tools: PathBuf,
        /// Where the browser is sent back to (loopback; port 0 picks a free one). A
        /// pre-registered client needs the redirect URI it was registered with:
        /// `http://ADDRESS/callback`.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
        /// How long to wait for the browser.
        #[arg(long, default_value = "10m", value_parser = client::parse_duration)]
        wait: std::time::Duration,
    },
}

/// What an operator does to an effect.
#[derive(Debug, Subcommand)]
enum EffectsCommand {
    /// Settles an effect in `reconciliation_required` with what the executor's system
    /// says: `--outcome committed` (applied) or `rejected` (not applied). With `[auth]`
    /// on, the token needs the operator role.
    Settle {
        /// The effect key (as `effects --unresolved` lists it).
        effect_key: String,
        /// The invocation whose call carried it.
        #[arg(long)]
        invocation: String,
        /// What the executor's system says.
        #[arg(long, value_enum)]
        outcome: effects::Outcome,
        /// The executor's identifier of the applied change.
        #[arg(long, default_value = "")]
        receipt: String,
        /// How it was checked (kept in the ledger with who settled it).
        #[arg(long)]
        detail: String,
        /// Who settles it, when the orchestrator authenticates nobody (default: $USER);
        /// with `--token`, the token's actor.
        #[arg(long)]
        actor: Option<String>,
        /// A running orchestrator; without it, the embedded one over the data directory.
        #[arg(long)]
        server: Option<String>,
        /// The settled entry as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// What the replies to a waiting invocation share.
#[derive(Debug, Args)]
struct ReplyArgs {
    /// A running orchestrator; without it, the embedded one over the data directory.
    #[arg(long)]
    server: Option<String>,
    /// The embedded run's Cedar policy files, as `run` was given them: the resumed
    /// invocation runs under them.
    #[arg(long = "policies", value_name = "FILE", conflicts_with = "server")]
    policies: Vec<PathBuf>,
    /// The embedded run's acceptance rules, as `run` was given them.
    #[arg(long, value_name = "FILE", conflicts_with = "server")]
    acceptance: Option<PathBuf>,
    /// The embedded run's tool registry, as `run` was given it: the resumed invocation
    /// calls its tools (an MCP server that asked a question gets the answer).
    #[arg(long, value_name = "FILE", conflicts_with = "server")]
    tools: Option<PathBuf>,
    /// When the invocation waits for a human again: `follow` it, or `exit` (the
    /// default off a terminal).
    #[arg(long, value_enum)]
    on_wait: Option<client::OnWait>,
    /// JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

impl ReplyArgs {
    /// Where the reply goes, and how the invocation is followed after it.
    async fn open(
        self,
        token: Option<String>,
        data_dir: &Path,
    ) -> anyhow::Result<(Target, client::Follow)> {
        let embedding = Embedding {
            tools: self.tools,
            policies: self.policies,
            acceptance: self.acceptance,
        };
        let target = Target::open(self.server, token, data_dir, embedding).await?;
        let follow = target.follow(self.json, self.on_wait);
        Ok((target, follow))
    }
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// Invocations, all running at once.
    #[arg(long, default_value_t = 1_000)]
    invocations: u32,
    /// Turns per invocation: T-1 turns of two lookups, then the answer.
    #[arg(long, default_value_t = 10)]
    turns: u32,
    /// `embedded`: in-process ports; `distributed`: five gRPC servers on loopback;
    /// `cluster`: the production overlay as processes (`deploy/local/cluster`) over
    /// PostgreSQL and Redis, run after `embedded` and `distributed`, all three reported.
    #[arg(long, value_enum, default_value = "embedded")]
    mode: bench::Mode,
    /// `cluster`: a PostgreSQL server's admin URL; the bench creates two databases of its
    /// own there and drops them afterwards.
    #[arg(long, default_value = bench::DEFAULT_POSTGRES_URL)]
    postgres_url: String,
    /// `cluster`: the Redis the orchestrators keep their leases in.
    #[arg(long, default_value = bench::DEFAULT_REDIS_URL)]
    redis_url: String,
    /// `cluster`: the folder of the service binaries (default: this binary's).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// `cluster`: the script that starts it (default: the repository's
    /// `deploy/local/cluster`, where this binary was built).
    #[arg(long)]
    cluster_script: Option<PathBuf>,
    /// Park every invocation in its first model call and report the memory each costs.
    #[arg(long)]
    park: bool,
    /// Where the temporary data directory goes (default: the system's temp directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Authenticate every call with a JWT (HS256), as `[auth] mode = "jwt"` does.
    #[arg(long)]
    auth: bool,
    /// Cedar policy files: the workload runs without policies, then with every call
    /// authorized by these (they must permit `lookup`), and both are reported.
    #[arg(long = "policies", value_name = "FILE")]
    policies: Vec<PathBuf>,
    /// The workload runs with telemetry off, then with every service exporting every
    /// span (100% sampling) over OTLP to a receiver in this process, and both are
    /// reported.
    #[arg(long)]
    traces: bool,
    /// JSON instead of text (one object per run).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ChaosArgs {
    /// Invocations of the workload, each a lookup, a transfer and an answer, started
    /// evenly from the first fault to the last.
    #[arg(long, default_value_t = 1_000)]
    invocations: usize,
    /// The schedule's seed (default: a random one, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Rounds of every kind of fault.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// The orchestrators' lease time-to-live; faults last 2.5 to 4 of them.
    #[arg(long, default_value = "1s", value_parser = client::parse_duration)]
    lease: Duration,
    /// How long every invocation may take to end once the faults have healed.
    #[arg(long, default_value = "120s", value_parser = client::parse_duration)]
    recovery_bound: Duration,
    /// The folder of the service binaries (default: this binary's).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// The script that starts the cluster (default: the repository's
    /// `deploy/local/cluster`, where this binary was built).
    #[arg(long)]
    cluster_script: Option<PathBuf>,
    /// JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The scripted-model file (JSON).
    #[arg(long, required_unless_present_any = ["model", "cassette"], conflicts_with_all = ["model", "cassette"])]
    script: Option<PathBuf>,
    /// Replays a cassette `--record` wrote instead of calling a model: the same decisions,
    /// usage and response IDs, turn by turn, as long as the run asks what the recorded one
    /// asked (otherwise it ends `model_error` naming the turn). Embedded runs only.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["model", "server"])]
    cassette: Option<PathBuf>,
    /// Records every decision of `--model` into this cassette file, with its usage and
    /// response ID.
    #[arg(long, value_name = "FILE", requires = "model")]
    record: Option<PathBuf>,
    /// A real model instead of a script: `openai:MODEL` (any OpenAI-compatible server;
    /// `OPENAI_BASE_URL`, `OPENAI_API_KEY`) or `anthropic:MODEL` (`ANTHROPIC_API_KEY`,
    /// `ANTHROPIC_BASE_URL`). Embedded runs only.
    #[arg(long, requires = "goal", conflicts_with = "server")]
    model: Option<String>,
    /// The goal; defaults to one naming the script (required with `--model`).
    #[arg(long)]
    goal: Option<String>,
    /// Tools config (TOML) for the embedded run; without it the demo executor's tools.
    #[arg(long, conflicts_with = "server")]
    tools: Option<PathBuf>,
    /// The embedded orchestrator's configuration file, as `dev --config` reads it
    /// (`[limits]`, `[telemetry]`, ...) [env: AGENTLOOP_ORCHESTRATOR_CONFIG].
    #[arg(long, value_name = "FILE", conflicts_with = "server")]
    config: Option<PathBuf>,
    /// Cedar policy files authorizing every call of the embedded run (`docs/policies.md`).
    #[arg(long = "policies", value_name = "FILE", conflicts_with = "server")]
    policies: Vec<PathBuf>,
    /// The default profile's acceptance rules of final answers for the embedded run
    /// (`docs/verification.md`).
    #[arg(long, value_name = "FILE", conflicts_with = "server")]
    acceptance: Option<PathBuf>,
    /// The actor's roles, which policies test (comma-separated or repeated). With a
    /// token, they must be the token's.
    #[arg(long, value_delimiter = ',')]
    roles: Vec<String>,
    /// A running orchestrator instead of the embedded default.
    #[arg(long)]
    server: Option<String>,
    /// JSON summary instead of text.
    #[arg(long)]
    json: bool,
    /// When the invocation stops to wait for a human (an approval, an answer): `follow`
    /// it (the default on a terminal: reply from another one with the printed command),
    /// or `exit` with the waiting reason's code (the default off a terminal).
    #[arg(long, value_enum)]
    on_wait: Option<client::OnWait>,
    /// Overrides the longest wait for a human: `30m`, `8h`.
    #[arg(long, value_parser = client::parse_duration)]
    max_wait: Option<std::time::Duration>,
    /// Makes the start idempotent: the same key and request give the same invocation.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Overrides the profile's turn budget.
    #[arg(long)]
    max_steps: Option<u32>,
    /// Overrides the profile's tool-call budget.
    #[arg(long)]
    max_tool_calls: Option<u32>,
    /// Overrides how often the same plan may run in a row (0 turns the check off).
    #[arg(long)]
    max_repeated_plan: Option<u32>,
    /// Overrides the wall-clock budget: `500ms`, `30s`, `5m`, `1h`.
    #[arg(long, value_parser = client::parse_duration)]
    deadline: Option<std::time::Duration>,
    /// Sets a cost budget in US dollars (`0.50`); spent, the run ends
    /// `token_budget_exhausted`. Every decision must have a cost: give `--price` with
    /// `--model` (an unpriced decision ends the run `model_error`).
    #[arg(long, value_name = "USD")]
    max_cost_usd: Option<agentloop_engine::MicroUsd>,
    /// The price of `--model` in US dollars per million input and output tokens:
    /// `2.50,10`. Each decision then reports its cost.
    // Conflicts rather than `requires = "model"`, which clap let through next to
    // `--script --goal`.
    #[arg(long, value_name = "INPUT,OUTPUT", conflicts_with_all = ["script", "server"])]
    price: Option<agentloop_decision::Price>,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(if error.use_stderr() { exit::USAGE } else { 0 });
        }
    };
    // Logs go to stderr (stdout is for results and `--json`); quiet unless RUST_LOG says.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    agentloop_server::install_crypto_provider();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("agentloop: cannot start the runtime: {error}");
            return ExitCode::from(exit::FAILURE);
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(error) => ExitCode::from(failed(&error)),
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Dev {
            listen,
            tools,
            config,
            metrics,
            http,
            insecure_no_auth,
            policies,
            acceptance,
            model,
            price,
            script,
        } => {
            let mut options = embedded(
                cli.data_dir,
                tools.as_deref(),
                policies,
                acceptance.as_deref(),
            )?;
            options.services.model = match (model, script) {
                (Some(spec), _) => Some(model::from_spec(&spec, price)?),
                (None, Some(path)) => {
                    let text = client::read_script(&path)?;
                    let scripted = agentloop_decision::ScriptedModel::parse(&text)
                        .map_err(|e| anyhow::anyhow!("--script {}: {e}", path.display()))?;
                    Some(Arc::new(scripted) as Arc<dyn agentloop_decision::Model>)
                }
                (None, None) => None,
            };
            let serving = Serving {
                config: config.as_deref(),
                listen,
                metrics: MetricsAt::Configured(metrics),
                http: HttpAt::Dev(http),
                insecure_no_auth,
            };
            let running = embedded::configure(serving)?.start(options).await?;
            println!(
                "agentloop dev: the orchestrator on {}",
                running.stack().endpoint()
            );
            if let Some(endpoint) = running.stack().http_endpoint() {
                println!("agentloop dev: the console on {endpoint}/");
                println!("agentloop dev: the HTTP/JSON API on {endpoint}/v1/invocations");
                println!(
                    "agentloop dev: the A2A agent on {endpoint} (its card at {endpoint}/.well-known/agent-card.json)"
                );
            }
            if let Some(address) = running.metrics_address() {
                println!("agentloop dev: metrics on http://{address}/metrics");
            }
            println!("press Ctrl-C to stop");
            agentloop_server::shutdown_signal().await;
            running.stop().await?;
            Ok(0)
        }
        Command::Run(args) => {
            if args.model.is_some() && args.max_cost_usd.is_some() && args.price.is_none() {
                eprintln!(
                    "agentloop: --max-cost-usd with --model needs --price: without the model's price its cost cannot be counted"
                );
                return Ok(exit::USAGE);
            }
            let (script, model, goal) = match (&args.script, &args.model, &args.cassette) {
                (Some(path), None, None) => (
                    client::read_script(path)?,
                    None,
                    args.goal
                        .unwrap_or_else(|| format!("Run the scripted scenario {}", path.display())),
                ),
                (None, Some(spec), None) => {
                    let model = model::from_spec(spec, args.price)?;
                    let model: Arc<dyn agentloop_decision::Model> = match args.record {
                        Some(path) => Arc::new(cassette::Recording::new(model, path)),
                        None => model,
                    };
                    (String::new(), Some(model), args.goal.unwrap_or_default())
                }
                (None, None, Some(path)) => {
                    let cassette =
                        cassette::Cassette::load(path).map_err(|why| anyhow::anyhow!(why))?;
                    let goal = args.goal.unwrap_or_else(|| cassette.goal.clone());
                    let model: Arc<dyn agentloop_decision::Model> =
                        Arc::new(cassette::Replaying::new(cassette));
                    (String::new(), Some(model), goal)
                }
                _ => anyhow::bail!("give exactly one of --script, --model and --cassette"),
            };
            let options = RunOptions {
                goal,
                script,
                json: args.json,
                idempotency_key: args.idempotency_key,
                max_steps: args.max_steps,
                max_tool_calls: args.max_tool_calls,
                max_repeated_plan: args.max_repeated_plan,
                deadline: args.deadline,
                max_cost: args.max_cost_usd,
                max_wait: args.max_wait,
                roles: args.roles,
            };
            let on_wait = args
                .on_wait
                .unwrap_or_else(client::OnWait::default_for_terminal);
            match args.server {
                Some(endpoint) => {
                    let follow = client::Follow {
                        json: args.json,
                        on_wait,
                        resume_flags: format!(" --server {endpoint}"),
                        watcher: false,
                    };
                    client::run(server(&endpoint, cli.token.as_deref()), options, follow).await
                }
                None => {
                    let data_dir_flags = embedded_flags(
                        &cli.data_dir,
                        args.tools.as_deref(),
                        &args.policies,
                        args.acceptance.as_deref(),
                    );
                    let mut stack_options = embedded(
                        cli.data_dir,
                        args.tools.as_deref(),
                        args.policies,
                        args.acceptance.as_deref(),
                    )?;
                    let mut configuration = embedded::configure(Serving {
                        config: args.config.as_deref(),
                        ..Serving::local()
                    })?;
                    if model.is_some() {
                        // A real model gets one repair turn: an output that breaks the
                        // protocol is fed back once before the run ends `invalid_decision`.
                        configuration.config.limits.decision_repairs = 1;
                    }
                    stack_options.services.model = model;
                    let running = configuration.start(stack_options).await?;
                    let endpoint = running.stack().endpoint();
                    // Attached, the reply reaches this process's port; after it exits,
                    // the embedded orchestrator the reply starts over the data directory.
                    let resume_flags = match on_wait {
                        client::OnWait::Follow => format!(" --server {endpoint}"),
                        client::OnWait::Exit => data_dir_flags,
                    };
                    let follow = client::Follow {
                        json: args.json,
                        on_wait,
                        resume_flags,
                        watcher: false,
                    };
                    let result =
                        client::run(server(&endpoint, cli.token.as_deref()), options, follow).await;
                    running.stop().await?;
                    result
                }
            }
        }
        Command::Eval {
            suites,
            schema,
            json,
            junit,
            min_pass_rate,
            jobs,
            server,
        } => {
            if schema {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&agentloop_eval::case::schema())?
                );
                return Ok(0);
            }
            eval::eval(eval::Eval {
                suites,
                json,
                junit,
                min_pass_rate,
                jobs: usize::from(jobs),
                server: server.map(|endpoint| (endpoint, cli.token)),
            })
            .await
        }
        Command::Replay {
            ids,
            all,
            since,
            limit,
            tools,
            policies,
            acceptance,
            database_url,
            ledger_database_url,
            json,
        } => {
            let mut options = embedded(
                cli.data_dir,
                tools.as_deref(),
                policies,
                acceptance.as_deref(),
            )?;
            options.services.ledger.database_url =
                ledger_database_url.or_else(|| database_url.clone());
            let replaying = if all {
                agentloop_stack::Replaying::All {
                    since: since.map(|ago| {
                        use agentloop_engine::Clock as _;
                        let now = agentloop_engine::SystemClock.now().0;
                        let ago = u64::try_from(ago.as_millis()).unwrap_or(u64::MAX);
                        agentloop_engine::UnixMillis(now.saturating_sub(ago))
                    }),
                    limit: usize::try_from(limit).unwrap_or(usize::MAX),
                }
            } else {
                agentloop_stack::Replaying::Ids(ids)
            };
            let replayed =
                agentloop_stack::replay(options.services, database_url.as_deref(), replaying)
                    .await?;
            replay::print(&replayed, json)?;
            Ok(0)
        }
        Command::Show {
            id,
            server: endpoint,
            json,
        } => match endpoint {
            Some(endpoint) => {
                client::show_remote(server(&endpoint, cli.token.as_deref()), &id, json).await
            }
            None => client::show_local(&cli.data_dir, &id, json).await,
        },
        Command::List {
            server: endpoint,
            state,
            reason,
            limit,
            json,
        } => {
            let target =
                Target::open(endpoint, cli.token, &cli.data_dir, Embedding::default()).await?;
            let filter = pb::ListInvocationsRequest {
                state: state
                    .map_or(pb::InvocationState::Unspecified, StateFilter::wire)
                    .into(),
                terminal_reason: reason.map_or(0, |r| agentloop_wire::terminal_reason(r).into()),
                ..Default::default()
            };
            let result = client::list(target.server(), &filter, limit, json).await;
            target.close().await?;
            result
        }
        Command::Watch {
            id,
            server: endpoint,
            from_seq,
            json,
        } => {
            let target =
                Target::open(endpoint, cli.token, &cli.data_dir, Embedding::default()).await?;
            let follow = client::Follow {
                watcher: true,
                ..target.follow(json, Some(client::OnWait::Follow))
            };
            let result = async {
                let mut orchestrator = client::client(target.server()).await?;
                client::follow_to_end(&mut orchestrator, &id, from_seq, Instant::now(), &follow)
                    .await
            }
            .await;
            target.close().await?;
            result
        }
        Command::Pending {
            server: endpoint,
            json,
        } => {
            let target =
                Target::open(endpoint, cli.token, &cli.data_dir, Embedding::default()).await?;
            let result = humans::pending(target.server(), json, &target.resume_flags).await;
            target.close().await?;
            result
        }
        Command::Approve {
            id,
            deny,
            comment,
            digest,
            yes,
            actor,
            reply,
        } => {
            let (target, follow) = reply.open(cli.token, &cli.data_dir).await?;
            let request = humans::Approve {
                id,
                deny,
                comment,
                digest,
                yes,
                actor: target.actor(actor),
            };
            let result = humans::approve(target.server(), request, follow).await;
            target.close().await?;
            result
        }
        Command::Answer {
            id,
            text,
            decline,
            cancel,
            actor,
            reply,
        } => {
            let (target, follow) = reply.open(cli.token, &cli.data_dir).await?;
            let actor = target.actor(actor);
            let given = match (text, decline, cancel) {
                (Some(text), _, _) => humans::Given::Text(text),
                (None, true, _) => humans::Given::Decline,
                (None, false, _) => humans::Given::Cancel,
            };
            let result = humans::answer(target.server(), &id, given, actor, follow).await;
            target.close().await?;
            result
        }
        Command::Health {
            server,
            service,
            wait,
        } => client::health(&server, &service, wait.unwrap_or_default()).await,
        Command::Cancel {
            id,
            server: endpoint,
            reason,
        } => client::cancel(server(&endpoint, cli.token.as_deref()), &id, &reason).await,
        Command::Effects {
            command:
                Some(EffectsCommand::Settle {
                    effect_key,
                    invocation,
                    outcome,
                    receipt,
                    detail,
                    actor,
                    server: endpoint,
                    json,
                }),
            ..
        } => {
            let target =
                Target::open(endpoint, cli.token, &cli.data_dir, Embedding::default()).await?;
            let settle = effects::Settle {
                invocation_id: invocation,
                effect_key,
                outcome,
                receipt,
                detail,
                actor: target.actor(actor),
            };
            let result = effects::settle(target.server(), settle, json).await;
            target.close().await?;
            result
        }
        Command::Effects {
            command: None,
            unresolved: _,
            server: endpoint,
            invocation,
            json,
        } => {
            let source = match &endpoint {
                Some(endpoint) => effects::Source::Server(server(endpoint, cli.token.as_deref())),
                None => effects::Source::DataDir(&cli.data_dir),
            };
            effects::unresolved(source, invocation.as_deref(), json).await
        }
        Command::Chaos(args) => {
            let seed = args.seed.unwrap_or_else(rand::random);
            // Said first: a run that dies half-way can still be repeated.
            eprintln!("chaos: seed {seed}");
            let report = agentloop_chaos::run(&agentloop_chaos::Options {
                invocations: args.invocations,
                seed,
                rounds: args.rounds,
                lease: args.lease,
                recovery_bound: args.recovery_bound,
                script: args
                    .cluster_script
                    .unwrap_or_else(bench::cluster::default_script),
                bin_dir: binaries_or(args.bin_dir)?,
            })
            .await?;
            if args.json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print!("{}", report.text());
            }
            Ok(if report.holds() { 0 } else { exit::FAILURE })
        }
        Command::Bench(args) => {
            let bin_dir = binaries_or(args.bin_dir)?;
            let options = bench::BenchOptions {
                invocations: args.invocations,
                turns: args.turns,
                mode: args.mode,
                park: args.park,
                dir: args.dir,
                auth: args.auth,
                policies: Vec::new(),
                traces: false,
                cluster: bench::ClusterSettings {
                    script: args
                        .cluster_script
                        .unwrap_or_else(bench::cluster::default_script),
                    bin_dir,
                    postgres_url: args.postgres_url,
                    redis_url: args.redis_url,
                },
            };
            bench::BenchOptions {
                policies: args.policies.clone(),
                traces: args.traces,
                ..options.clone()
            }
            .check()?;
            // With policies or traces, the same workload without them first; a cluster
            // after the two in-process wirings: each set is measured in one run, on the
            // same machine.
            let mut runs = match args.mode {
                bench::Mode::Cluster => [bench::Mode::Embedded, bench::Mode::Distributed]
                    .into_iter()
                    .map(|mode| bench::BenchOptions {
                        mode,
                        ..options.clone()
                    })
                    .collect(),
                bench::Mode::Embedded | bench::Mode::Distributed => Vec::new(),
            };
            runs.push(options.clone());
            if !args.policies.is_empty() {
                runs.push(bench::BenchOptions {
                    policies: args.policies,
                    ..options.clone()
                });
            }
            if args.traces {
                runs.push(bench::BenchOptions {
                    traces: true,
                    ..options
                });
            }
            let mut reports = Vec::with_capacity(runs.len());
            for run in runs {
                let report = bench::run(run).await?;
                if args.json {
                    println!("{}", serde_json::to_string(&report)?);
                } else {
                    print!("{}", report.text());
                }
                reports.push(report);
            }
            if let [without, with @ ..] = reports.as_slice()
                && !args.json
                && without.turns_per_s > 0.0
            {
                for with in with.iter().filter(|with| with.mode == without.mode) {
                    let what = if with.traces {
                        "with traces "
                    } else {
                        "with policies"
                    };
                    println!(
                        "{what}    {:.1}% of the turns/s without",
                        100.0 * with.turns_per_s / without.turns_per_s
                    );
                }
            }
            Ok(if reports.iter().all(|r| r.failed == 0) {
                0
            } else {
                exit::FAILURE
            })
        }
        Command::Token {
            secret_file,
            issuer,
            audience,
            actor,
            tenant,
            roles,
            valid_for,
        } => {
            let secret = agentloop_auth::read_secret_file(&secret_file)?;
            let token = agentloop_auth::mint_hs256(
                &secret,
                &agentloop_auth::DevToken {
                    issuer,
                    audience,
                    actor,
                    tenant,
                    roles,
                    valid_for_s: valid_for.as_secs().max(1),
                },
            )?;
            println!("{token}");
            Ok(0)
        }
        Command::Policy { command } => policy::run(command),
        Command::Mcp {
            command:
                McpCommand::Login {
                    server,
                    tools,
                    listen,
                    wait,
                },
        } => mcp::login(&server, &tools, listen, wait).await,
        Command::Demo { json } => {
            let resume_flags = data_dir_flag(&cli.data_dir);
            let running = local(StackOptions::embedded(cli.data_dir)).await?;
            let endpoint = running.stack().endpoint();
            let options = RunOptions {
                goal: "Load the customer profile and the refund policy".into(),
                script: client::DEMO_SCRIPT.to_owned(),
                json,
                idempotency_key: None,
                max_steps: None,
                max_tool_calls: None,
                max_repeated_plan: None,
                deadline: None,
                max_cost: None,
                max_wait: None,
                roles: Vec::new(),
            };
            let follow = client::Follow {
                json,
                on_wait: client::OnWait::Exit,
                resume_flags,
                watcher: false,
            };
            let result =
                client::run(server(&endpoint, cli.token.as_deref()), options, follow).await;
            running.stop().await?;
            result
        }
    }
}

/// `list --reason`: a terminal reason by its name.
/// `eval --min-pass-rate`: a share from 0 to 1.
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        Ok(_) | Err(_) => Err(format!("{text:?} is not a rate from 0 to 1")),
    }
}

fn parse_reason(text: &str) -> Result<agentloop_engine::TerminalReason, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not a terminal reason (see the exit codes)"))
}

/// `list --state`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum StateFilter {
    Running,
    Waiting,
    Ended,
}

impl StateFilter {
    fn wire(self) -> pb::InvocationState {
        match self {
            StateFilter::Running => pb::InvocationState::Running,
            StateFilter::Waiting => pb::InvocationState::Waiting,
            StateFilter::Ended => pb::InvocationState::Ended,
        }
    }
}

/// The embedded orchestrator of a command other than `dev` and `run`: on a free loopback
/// port, configured by the file `AGENTLOOP_ORCHESTRATOR_CONFIG` names, if any.
async fn local(options: StackOptions) -> anyhow::Result<Embedded> {
    embedded::configure(Serving::local())?.start(options).await
}

fn server<'a>(endpoint: &'a str, token: Option<&'a str>) -> client::Server<'a> {
    client::Server { endpoint, token }
}

/// The data directory as the printed commands name it: nothing for the default.
fn data_dir_flag(data_dir: &Path) -> String {
    if data_dir == Path::new(DEFAULT_DATA_DIR) {
        String::new()
    } else {
        format!(" --data-dir {}", data_dir.display())
    }
}

/// The flags of an embedded stack as the printed commands name them: the data directory,
/// and the policies and acceptance rules the invocation ran under, so a reply resumes it
/// under the same.
fn embedded_flags(
    data_dir: &Path,
    tools: Option<&Path>,
    policies: &[PathBuf],
    acceptance: Option<&Path>,
) -> String {
    let mut flags = data_dir_flag(data_dir);
    if let Some(file) = tools {
        flags.push_str(&format!(" --tools {}", file.display()));
    }
    for file in policies {
        flags.push_str(&format!(" --policies {}", file.display()));
    }
    if let Some(file) = acceptance {
        flags.push_str(&format!(" --acceptance {}", file.display()));
    }
    flags
}

/// The orchestrator a reply goes to: the one at `--server`, or the embedded one over the
/// data directory, started for the command (it runs the resumed invocation).
struct Target {
    stack: Option<Embedded>,
    endpoint: String,
    token: Option<String>,
    resume_flags: String,
}

/// What the run that started an invocation was given, for the embedded orchestrator a
/// reply starts: its tool registry, policies and acceptance rules.
#[derive(Debug, Default)]
struct Embedding {
    tools: Option<PathBuf>,
    policies: Vec<PathBuf>,
    acceptance: Option<PathBuf>,
}

impl Target {
    /// The orchestrator at `endpoint`, or the embedded one over `data_dir`, with what
    /// the run that started the invocation was given.
    async fn open(
        endpoint: Option<String>,
        token: Option<String>,
        data_dir: &Path,
        embedding: Embedding,
    ) -> anyhow::Result<Target> {
        let Embedding {
            tools,
            policies,
            acceptance,
        } = embedding;
        Ok(match endpoint {
            Some(endpoint) => Target {
                stack: None,
                resume_flags: format!(" --server {endpoint}"),
                endpoint,
                token,
            },
            None => {
                let resume_flags =
                    embedded_flags(data_dir, tools.as_deref(), &policies, acceptance.as_deref());
                let options = embedded(
                    data_dir.to_owned(),
                    tools.as_deref(),
                    policies,
                    acceptance.as_deref(),
                )?;
                let running = local(options).await?;
                // The token goes only to an orchestrator that verifies tokens: without
                // `[auth]`, the reply names its actor itself.
                let token = token.filter(|_| running.authenticates());
                Target {
                    endpoint: running.stack().endpoint(),
                    stack: Some(running),
                    token,
                    resume_flags,
                }
            }
        })
    }

    fn server(&self) -> client::Server<'_> {
        server(&self.endpoint, self.token.as_deref())
    }

    /// Who replies: as given; with a token, the token's actor (sent empty); else $USER.
    fn actor(&self, given: Option<String>) -> String {
        match (given, &self.token) {
            (Some(actor), _) => actor,
            (None, Some(_)) => String::new(),
            (None, None) => std::env::var("USER")
                .ok()
                .filter(|user| agentloop_auth::is_valid_identity(user))
                .unwrap_or_else(|| "operator".to_owned()),
        }
    }

    fn follow(&self, json: bool, on_wait: Option<client::OnWait>) -> client::Follow {
        client::Follow {
            json,
            on_wait: on_wait.unwrap_or_else(client::OnWait::default_for_terminal),
            resume_flags: self.resume_flags.clone(),
            watcher: false,
        }
    }

    async fn close(self) -> anyhow::Result<()> {
        match self.stack {
            Some(stack) => stack.stop().await,
            None => Ok(()),
        }
    }
}

/// The embedded stack over `data_dir`, with the tool registry `tools`, the default
/// profile's `policies` and its `acceptance` rules, each if named.
fn embedded(
    data_dir: PathBuf,
    tools: Option<&Path>,
    policies: Vec<PathBuf>,
    acceptance: Option<&Path>,
) -> anyhow::Result<StackOptions> {
    let mut options = StackOptions::embedded(data_dir);
    options.services.tools = tools.map(ToolsConfig::load).transpose()?;
    if !policies.is_empty() {
        options.services.policy.policies =
            std::collections::BTreeMap::from([("default".to_owned(), policies)]);
    }
    if let Some(path) = acceptance {
        let rules = agentloop_policy::Acceptance::load(path, "default")?;
        options.services.policy.acceptance =
            std::collections::BTreeMap::from([("default".to_owned(), rules)]);
    }
    Ok(options)
}

/// The exit code of a command that failed: policies or acceptance rules that do not
/// load are the operator's to fix (exit 78, every problem printed), whichever command
/// started the stack that loads them; anything else fails the command.
fn failed(error: &anyhow::Error) -> u8 {
    if error.downcast_ref::<embedded::BadConfig>().is_some() {
        eprintln!("agentloop: {error}");
        return exit::BAD_CONFIG;
    }
    match error.downcast_ref::<agentloop_policy::PolicyError>() {
        Some(
            refused @ (agentloop_policy::PolicyError::Policies { .. }
            | agentloop_policy::PolicyError::Acceptance { .. }),
        ) => {
            eprintln!("agentloop: {refused}");
            exit::BAD_CONFIG
        }
        Some(_) | None => {
            eprintln!("agentloop: {error:#}");
            exit::FAILURE
        }
    }
}

/// `dir`, or the folder of this binary, where the service binaries are built beside it.
fn binaries_or(dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match dir {
        Some(dir) => Ok(dir),
        None => std::env::current_exe()?
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| anyhow::anyhow!("this binary's path has no folder")),
    }
}
