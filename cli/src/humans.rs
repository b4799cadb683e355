//! The commands of the humans an invocation waits for: `pending` lists what waits,
//! `approve` resolves a proposal (after showing its exact calls), `answer` answers a
//! question. The replies then follow the invocation, as `run` does.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Instant;

use agentloop_proto::v1 as pb;
use anyhow::{Context, bail};

use crate::client::{self, Follow, Server, get, status};
use crate::exit;
use crate::view::Waiting;
use crate::view::state_name;

/// Most waiting invocations `pending` lists.
const MAX_PENDING: usize = 1_000;

/// `pending`: every invocation that waits for a human, oldest wait first.
pub async fn pending(server: Server<'_>, json: bool, resume_flags: &str) -> anyhow::Result<u8> {
    let mut orchestrator = client::client(server).await?;
    let waiting_only = pb::ListInvocationsRequest {
        state: pb::InvocationState::Waiting.into(),
        ..Default::default()
    };
    let mut waiting: Vec<Waiting> =
        client::invocations(&mut orchestrator, &waiting_only, MAX_PENDING)
            .await?
            .iter()
            .filter_map(|invocation| Waiting::of(invocation, resume_flags))
            .collect();
    waiting.sort_by_key(|w| w.since_ms);
    client::print_rows(&waiting, json, "nothing waits for a human", |entry| {
        format!("{}\n", entry.render())
    })?;
    Ok(0)
}

/// What `approve` was asked to do.
#[derive(Debug, Clone)]
pub struct Approve {
    /// The invocation.
    pub id: String,
    /// Deny instead of approving.
    pub deny: bool,
    /// Words for the model.
    pub comment: String,
    /// The digest to approve; without it, the pending one, after a question on a
    /// terminal.
    pub digest: Option<String>,
    /// Approve without asking.
    pub yes: bool,
    /// Who approves (with authentication off; with it, the token says).
    pub actor: String,
}

/// `approve`: shows the pending proposal, asks on a terminal, resolves it, then follows
/// the invocation. Refuses, writing nothing, when it does not wait for an approval.
pub async fn approve(server: Server<'_>, request: Approve, follow: Follow) -> anyhow::Result<u8> {
    let started = Instant::now();
    let mut orchestrator = client::client(server).await?;
    let invocation = get(&mut orchestrator, &request.id).await?;
    let Some(pending) = &invocation.pending_approval else {
        bail!(
            "invocation {} does not wait for an approval (it is {})",
            request.id,
            state_name(&invocation)
        );
    };
    if let Some(notice) = Waiting::of(&invocation, &follow.resume_flags) {
        eprintln!("{}", notice.render());
    }
    let digest = match &request.digest {
        Some(digest) if *digest != pending.proposal_digest => bail!(
            "the pending proposal is {}, not {digest}: nothing was resolved",
            pending.proposal_digest
        ),
        Some(digest) => digest.clone(),
        None => pending.proposal_digest.clone(),
    };
    if !request.deny && !request.yes {
        let terminal = std::io::stdin().is_terminal();
        match (terminal, &request.digest) {
            (true, _) => {
                if !confirm(&format!("approve these {} call(s)?", pending.calls.len()))? {
                    eprintln!("not approved; invocation {} still waits", request.id);
                    return Ok(exit::code(
                        agentloop_engine::TerminalReason::ApprovalRequired,
                    ));
                }
            }
            // Pinned by its digest: the calls approved are the ones named.
            (false, Some(_)) => {}
            (false, None) => bail!(
                "not a terminal, so nobody can be asked: give --digest {} (the calls shown) \
                 or --yes",
                pending.proposal_digest
            ),
        }
    }
    let verdict = if request.deny {
        pb::ApprovalVerdict::Deny
    } else {
        pb::ApprovalVerdict::Approve
    };
    let resolved = orchestrator
        .resolve_approval(pb::ResolveApprovalRequest {
            invocation_id: request.id.clone(),
            proposal_digest: digest,
            verdict: verdict.into(),
            actor: request.actor,
            comment: request.comment,
        })
        .await
        .map_err(|s| status("the approval was refused", s))?
        .into_inner()
        .invocation
        .context("the orchestrator answered without an invocation")?;
    eprintln!(
        "{}; invocation {} is {}",
        if request.deny { "denied" } else { "approved" },
        request.id,
        state_name(&resolved)
    );
    client::follow_to_end(
        &mut orchestrator,
        &request.id,
        invocation.last_seq + 1,
        started,
        &follow,
    )
    .await
}

/// What `answer` was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Given {
    /// Words for the model, or the content a tool asked for.
    Text(String),
    /// Decline the tool's question.
    Decline,
    /// Dismiss the tool's question.
    Cancel,
}

/// `answer`: answers the pending question, then follows the invocation.
pub async fn answer(
    server: Server<'_>,
    id: &str,
    given: Given,
    actor: String,
    follow: Follow,
) -> anyhow::Result<u8> {
    let started = Instant::now();
    let mut orchestrator = client::client(server).await?;
    let invocation = get(&mut orchestrator, id).await?;
    if invocation.pending_question.is_none() {
        bail!(
            "invocation {id} does not wait for an answer (it is {})",
            state_name(&invocation)
        );
    }
    let tool_asks = invocation.pending_input.is_some();
    let (answer, action) = match (given, tool_asks) {
        (Given::Text(text), false) => (text, pb::InputAction::Unspecified),
        (Given::Text(text), true) => (text, pb::InputAction::Accept),
        (Given::Decline, true) => (String::new(), pb::InputAction::Decline),
        (Given::Cancel, true) => (String::new(), pb::InputAction::Cancel),
        (Given::Decline | Given::Cancel, false) => bail!(
            "invocation {id} waits for the model's question, which takes an answer: only a \
             tool's question can be declined or cancelled"
        ),
    };
    orchestrator
        .answer_clarification(pb::AnswerClarificationRequest {
            invocation_id: id.to_owned(),
            answer,
            actor,
            action: action.into(),
        })
        .await
        .map_err(|s| status("the answer was refused", s))?;
    eprintln!("answered; following invocation {id}");
    client::follow_to_end(
        &mut orchestrator,
        id,
        invocation.last_seq + 1,
        started,
        &follow,
    )
    .await
}

/// Asks `question` on the terminal; yes only for `y` or `yes`.
fn confirm(question: &str) -> anyhow::Result<bool> {
    let mut stderr = std::io::stderr().lock();
    write!(stderr, "{question} [y/N] ")?;
    stderr.flush()?;
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("cannot read the answer")?;
    Ok(matches!(
        line.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}
