//! `agentloop effects --unresolved`: the effect ledger's unresolved entries, for an
//! operator. An entry in `reconciliation_required` is one the runtime has given up on —
//! its executor could not tell whether the change was applied — and only an operator can
//! settle it, after checking the executor's system: `agentloop effects settle`, through
//! the orchestrator's `SettleEffect`, which checks the caller's role and tenant like
//! every other call. The others are still the runtime's to reconcile.
//!
//! The entries come from an orchestrator's `ListUnresolvedEffects` over gRPC
//! (`--server`, which checks the caller's token like every other call), or from the
//! ledger file of the embedded data directory through the ledger's own service code
//! in-process. Reading the file while `agentloop
//! dev` runs is safe: SQLite in WAL mode lets readers in beside the writer.
//!
//! Text is a table for people; `--json` prints one object per entry (JSON lines, like
//! `show --json`), a stable external format.

use std::io::Write;
use std::path::Path;

use agentloop_ledger::{LedgerConfig, LedgerService, LedgerStore};
use agentloop_proto::client::Transport;
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::effect_ledger_service_server::EffectLedgerService;
use agentloop_proto::v1::orchestrator_service_client::OrchestratorServiceClient;
use anyhow::{Context, bail};
use serde::Serialize;

use agentloop_stack::LEDGER_DIR;

use crate::client::Server;

/// Entries asked for per `ListUnresolved` page (the server may cap it lower).
const PAGE_SIZE: u32 = 500;
/// Most entries one listing shows; past it the listing stops and says so, and
/// `--invocation` narrows it.
pub const MAX_ENTRIES: usize = 100_000;
/// Longest detail shown in the table, in characters (`--json` shows all of it).
const TABLE_DETAIL_CHARS: usize = 80;

/// Where the entries are read.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// A running orchestrator.
    Server(Server<'a>),
    /// An embedded data directory.
    DataDir(&'a Path),
}

/// One unresolved entry, flattened for JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EffectView {
    /// The invocation whose call carries the effect.
    pub invocation_id: String,
    /// The call ID.
    pub call_id: String,
    /// The effect key the executor dedupes on.
    pub effect_key: String,
    /// The tool that applies it.
    pub tool: String,
    /// `prepared`, `dispatched`, `outcome_unknown` or `reconciliation_required`.
    pub state: String,
    /// How many times it was dispatched.
    pub attempt: u32,
    /// The detail of its last transition (for `reconciliation_required`: why the
    /// executor could not tell).
    pub detail: String,
    /// When it was prepared, milliseconds since the epoch.
    pub created_at_ms: i64,
    /// When it last changed, milliseconds since the epoch.
    pub updated_at_ms: i64,
}

impl EffectView {
    /// The view of a wire entry.
    pub fn from_proto(entry: &pb::EffectEntry) -> EffectView {
        EffectView {
            invocation_id: entry.invocation_id.clone(),
            call_id: entry.call_id.clone(),
            effect_key: entry.effect_key.clone(),
            tool: entry.tool.clone(),
            state: agentloop_wire::effect_state_name(entry.state),
            attempt: entry.attempt,
            detail: entry.detail.clone(),
            created_at_ms: millis(entry.created_at.as_ref()),
            updated_at_ms: millis(entry.updated_at.as_ref()),
        }
    }
}

fn millis(time: Option<&prost_types::Timestamp>) -> i64 {
    time.map_or(0, |t| {
        t.seconds
            .saturating_mul(1_000)
            .saturating_add(i64::from(t.nanos) / 1_000_000)
    })
}

/// A ledger to page through: a remote one, or the service over a local file.
enum Ledger {
    Remote(OrchestratorServiceClient<Transport>),
    Local(LedgerService, LedgerStore),
}

impl Ledger {
    async fn open(source: Source<'_>) -> anyhow::Result<Ledger> {
        match source {
            Source::Server(server) => Ok(Ledger::Remote(crate::client::client(server).await?)),
            Source::DataDir(data_dir) => {
                let config = LedgerConfig {
                    data_dir: data_dir.join(LEDGER_DIR),
                    ..LedgerConfig::default()
                };
                // Opening would create an empty ledger: a mistyped directory must say so.
                if !config.data_dir.join(agentloop_ledger::DB_FILE).exists() {
                    bail!(
                        "no effect ledger in {} (use --data-dir or --server)",
                        data_dir.display()
                    );
                }
                let store = config.open_store().await?;
                Ok(Ledger::Local(LedgerService::new(store.clone()), store))
            }
        }
    }

    async fn page(
        &mut self,
        request: pb::ListUnresolvedRequest,
    ) -> Result<pb::ListUnresolvedResponse, tonic::Status> {
        match self {
            Ledger::Remote(client) => {
                let listed = client
                    .list_unresolved_effects(pb::ListUnresolvedEffectsRequest {
                        invocation_id: request.invocation_id,
                        page_size: request.page_size,
                        page_token: request.page_token,
                    })
                    .await?
                    .into_inner();
                Ok(pb::ListUnresolvedResponse {
                    entries: listed.entries,
                    next_page_token: listed.next_page_token,
                })
            }
            Ledger::Local(service, _) => Ok(service
                .list_unresolved(tonic::Request::new(request))
                .await?
                .into_inner()),
        }
    }

    async fn close(self) {
        match self {
            Ledger::Remote(_) => {}
            Ledger::Local(_, store) => store.close().await,
        }
    }
}

/// The unresolved entries, oldest first, at most [`MAX_ENTRIES`]; the flag says whether
/// more were left out.
pub async fn list_unresolved(
    source: Source<'_>,
    invocation: Option<&str>,
) -> anyhow::Result<(Vec<pb::EffectEntry>, bool)> {
    if invocation.is_some_and(str::is_empty) {
        bail!("--invocation must not be empty");
    }
    let mut ledger = Ledger::open(source).await?;
    let listed = page_through(&mut ledger, invocation).await;
    ledger.close().await;
    listed
}

async fn page_through(
    ledger: &mut Ledger,
    invocation: Option<&str>,
) -> anyhow::Result<(Vec<pb::EffectEntry>, bool)> {
    let mut entries = Vec::new();
    let mut token = String::new();
    loop {
        let page = ledger
            .page(pb::ListUnresolvedRequest {
                invocation_id: invocation.unwrap_or_default().to_owned(),
                page_size: PAGE_SIZE,
                page_token: token.clone(),
            })
            .await
            .map_err(|status| {
                anyhow::anyhow!(
                    "cannot list unresolved effects: {:?}: {}",
                    status.code(),
                    status.message()
                )
            })?;
        entries.extend(page.entries);
        if page.next_page_token.is_empty() {
            return Ok((entries, false));
        }
        if entries.len() >= MAX_ENTRIES {
            entries.truncate(MAX_ENTRIES);
            return Ok((entries, true));
        }
        if page.next_page_token == token {
            bail!("the ledger returned the same page token twice");
        }
        token = page.next_page_token;
    }
}

/// What an operator found in the executor's system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Outcome {
    /// The change was applied.
    Committed,
    /// The change was not applied.
    Rejected,
}

/// An operator's settlement of one effect.
#[derive(Debug, Clone)]
pub struct Settle {
    /// The invocation whose call carried the effect.
    pub invocation_id: String,
    /// The effect.
    pub effect_key: String,
    /// What was found.
    pub outcome: Outcome,
    /// The executor's identifier of the applied change.
    pub receipt: String,
    /// How it was checked.
    pub detail: String,
    /// Who settles it (empty with a token: the token's actor).
    pub actor: String,
}

/// Settles an effect through the orchestrator's `SettleEffect` and prints the settled
/// entry (a line, or one JSON object with `json`). Returns the exit code: 0.
pub async fn settle(server: Server<'_>, settle: Settle, json: bool) -> anyhow::Result<u8> {
    let state = match settle.outcome {
        Outcome::Committed => pb::EffectState::Committed,
        Outcome::Rejected => pb::EffectState::Rejected,
    };
    let settled = crate::client::client(server)
        .await?
        .settle_effect(pb::SettleEffectRequest {
            invocation_id: settle.invocation_id,
            effect_key: settle.effect_key,
            state: state.into(),
            receipt: settle.receipt,
            detail: settle.detail,
            actor: settle.actor,
        })
        .await
        .map_err(|status| crate::client::status("cannot settle the effect", status))?
        .into_inner();
    let entry = settled
        .entry
        .context("the orchestrator answered without the entry")?;
    let output = if json {
        json_lines(std::slice::from_ref(&entry))?
    } else {
        format!(
            "settled {} of invocation {}: {}\n",
            entry.effect_key,
            printable(&entry.invocation_id, usize::MAX),
            agentloop_wire::effect_state_name(entry.state)
        )
    };
    write_stdout(&output)?;
    Ok(0)
}

/// Lists the unresolved entries on stdout (a table, or JSON lines with `json`). Returns
/// the exit code: 0, whatever is listed.
pub async fn unresolved(
    source: Source<'_>,
    invocation: Option<&str>,
    json: bool,
) -> anyhow::Result<u8> {
    let (entries, truncated) = list_unresolved(source, invocation).await?;
    let output = if json {
        json_lines(&entries)?
    } else {
        table(&entries)
    };
    if truncated {
        eprintln!(
            "agentloop: showing the first {MAX_ENTRIES} unresolved effects; narrow the \
             listing with --invocation"
        );
    }
    write_stdout(&output)?;
    Ok(0)
}

/// One JSON object per entry, one per line.
pub fn json_lines(entries: &[pb::EffectEntry]) -> anyhow::Result<String> {
    let mut out = String::new();
    for entry in entries {
        out.push_str(&serde_json::to_string(&EffectView::from_proto(entry))?);
        out.push('\n');
    }
    Ok(out)
}

/// The entries as an aligned table with a summary line; one line when there are none.
pub fn table(entries: &[pb::EffectEntry]) -> String {
    if entries.is_empty() {
        return "no unresolved effects\n".to_owned();
    }
    const HEADERS: [&str; 8] = [
        "STATE",
        "ATTEMPT",
        "UPDATED",
        "INVOCATION",
        "CALL",
        "TOOL",
        "EFFECT KEY",
        "DETAIL",
    ];
    let rows: Vec<[String; 8]> = entries
        .iter()
        .map(|entry| {
            [
                agentloop_wire::effect_state_name(entry.state),
                entry.attempt.to_string(),
                entry
                    .updated_at
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), ToString::to_string),
                printable(&entry.invocation_id, usize::MAX),
                printable(&entry.call_id, usize::MAX),
                printable(&entry.tool, usize::MAX),
                entry.effect_key.clone(),
                printable(&entry.detail, TABLE_DETAIL_CHARS),
            ]
        })
        .collect();
    let mut widths = HEADERS.map(|header| header.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&HEADERS);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
    let flagged = entries
        .iter()
        .filter(|entry| entry.state == pb::EffectState::ReconciliationRequired as i32)
        .count();
    out.push_str(&format!(
        "{} unresolved; {flagged} need an operator (reconciliation_required)\n",
        entries.len()
    ));
    out
}

/// `text` on one table line: control characters (a detail may hold newlines) become
/// spaces, and more than `max` characters are cut with an ellipsis.
fn printable(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect();
    if text.chars().count() > max {
        out.pop();
        out.push('…');
    }
    out
}

/// Writes to stdout; a closed pipe (`| head`) ends the listing quietly.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(error).context("cannot write to stdout")
        }
        Ok(()) | Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(call: &str, state: pb::EffectState, detail: &str) -> pb::EffectEntry {
        pb::EffectEntry {
            invocation_id: "inv-1".into(),
            call_id: call.into(),
            effect_key: agentloop_ledger::effect_key("inv-1", call),
            attempt: 1,
            tool: "transfer".into(),
            state: state as i32,
            receipt: String::new(),
            created_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 5_000_000,
            }),
            updated_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_001,
                nanos: 0,
            }),
            detail: detail.into(),
        }
    }

    #[test]
    fn table_aligns_columns_and_counts_what_needs_an_operator() {
        let entries = [
            entry("c-1", pb::EffectState::Dispatched, ""),
            entry(
                "c-22",
                pb::EffectState::ReconciliationRequired,
                "executor\ncannot tell",
            ),
        ];
        let text = table(&entries);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("STATE                    ATTEMPT  UPDATED"));
        assert!(lines[1].starts_with("dispatched               1        2023-11-14T22:13:21Z"));
        assert!(lines[2].starts_with("reconciliation_required  1"));
        assert!(lines[2].ends_with(&format!(
            "{}  executor cannot tell",
            agentloop_ledger::effect_key("inv-1", "c-22")
        )));
        // Every row starts its columns at the same offsets.
        let column = |line: &str| line.find("inv-1").unwrap();
        assert_eq!(column(lines[1]), column(lines[2]));
        assert_eq!(lines[0].find("INVOCATION").unwrap(), column(lines[1]));
        assert_eq!(
            lines[3],
            "2 unresolved; 1 need an operator (reconciliation_required)"
        );
        assert_eq!(table(&[]), "no unresolved effects\n");
    }

    #[test]
    fn long_details_are_cut_in_the_table_only() {
        let long = "x".repeat(200);
        let entries = [entry("c", pb::EffectState::OutcomeUnknown, &long)];
        let text = table(&entries);
        assert!(text.contains(&format!("{}…", "x".repeat(TABLE_DETAIL_CHARS - 1))));
        assert!(!text.contains(&"x".repeat(TABLE_DETAIL_CHARS)));
        let json = json_lines(&entries).unwrap();
        let value: serde_json::Value = serde_json::from_str(json.trim_end()).unwrap();
        assert_eq!(value["detail"], long);
    }

    #[test]
    fn json_lines_are_one_object_per_entry() {
        let entries = [
            entry("c-1", pb::EffectState::Prepared, ""),
            entry("c-2", pb::EffectState::ReconciliationRequired, "why"),
        ];
        let json = json_lines(&entries).unwrap();
        let values: Vec<serde_json::Value> = json
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(values.len(), 2);
        assert_eq!(
            values[1],
            serde_json::json!({
                "invocation_id": "inv-1",
                "call_id": "c-2",
                "effect_key": agentloop_ledger::effect_key("inv-1", "c-2"),
                "tool": "transfer",
                "state": "reconciliation_required",
                "attempt": 1,
                "detail": "why",
                "created_at_ms": 1_700_000_000_005_i64,
                "updated_at_ms": 1_700_000_001_000_i64,
            })
        );
    }
}
