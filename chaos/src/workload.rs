//! The workload: invocations that read then write, started at a steady pace through
//! either orchestrator (the other one when the first does not answer), and read back
//! through the public API at the end.

use std::sync::Arc;
use std::time::Duration;

use agentloop_proto::client::Transport;
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::orchestrator_service_client::OrchestratorServiceClient;
use anyhow::{Context, bail};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::check::{Invocation, LedgerEffect};

/// A client of one orchestrator.
pub type Client = OrchestratorServiceClient<Transport>;

/// The call of each invocation that writes.
pub const WRITE_CALL: &str = "b";

/// How long one request may take before the other orchestrator is asked.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long an invocation may take to be started, over every attempt.
const START_WITHIN: Duration = Duration::from_secs(90);
/// Starts in flight at once.
const STARTS_IN_FLIGHT: usize = 64;
/// Reads in flight at once at the end.
const READS_IN_FLIGHT: usize = 16;

/// How long the model thinks before each turn: an invocation lasts about three of these,
/// so that many are in flight when a fault strikes.
const THINKING_MS: u64 = 400;

/// The model's script for invocation `index`: a lookup, a transfer of its own (under the
/// approval threshold, so no human is needed), and an answer citing both.
pub fn script(index: usize) -> String {
    serde_json::json!({"turns": [
        {"tool_calls": [{"id": "a", "name": "lookup", "arguments": {"key": "profile"}}],
         "delay_ms": THINKING_MS},
        {"tool_calls": [{"id": WRITE_CALL, "name": "transfer", "arguments": {
            "from": format!("chaos-{index}"), "to": "chaos-sink", "amount": 1 + index % 9_000}}],
         "delay_ms": THINKING_MS},
        {"final": format!("moved the amount of case {index}"), "evidence": ["a", WRITE_CALL],
         "delay_ms": THINKING_MS}
    ]})
    .to_string()
}

/// Starts invocation `index` under idempotency key `key`, trying orchestrator
/// `index % 2` first and the other when one does not answer in time. Its ID, or why it
/// could not be started within [`START_WITHIN`].
async fn start(clients: &[Client], index: usize, key: String) -> Result<String, String> {
    let deadline = Instant::now() + START_WITHIN;
    let mut last = String::new();
    let mut pause = Duration::from_millis(100);
    for attempt in 0.. {
        if Instant::now() >= deadline {
            break;
        }
        let mut client = clients[(index + attempt) % clients.len()].clone();
        let request = pb::StartInvocationRequest {
            idempotency_key: key.clone(),
            goal: format!("chaos case {index}"),
            scripted_model_json: script(index),
            ..Default::default()
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, client.start_invocation(request)).await {
            Ok(Ok(response)) => {
                if let Some(invocation) = response.into_inner().invocation {
                    return Ok(invocation.invocation_id);
                }
                last = "the answer held no invocation".into();
            }
            Ok(Err(status)) => last = format!("{}: {}", status.code(), status.message()),
            Err(_) => last = format!("no answer within {REQUEST_TIMEOUT:?}"),
        }
        // The bounded back-off of a retry, not synchronisation.
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
    Err(format!(
        "case {index} was not started within {START_WITHIN:?}: {last}"
    ))
}

/// Starts `count` invocations evenly over `span`, keys prefixed by `run`; each one's ID,
/// or why it could not be started.
pub async fn start_all(
    clients: Arc<Vec<Client>>,
    count: usize,
    span: Duration,
    run: &str,
) -> Vec<Result<String, String>> {
    let began = Instant::now();
    let slots = Arc::new(Semaphore::new(STARTS_IN_FLIGHT));
    let mut tasks = Vec::with_capacity(count);
    for index in 0..count {
        let due = span.mul_f64(fraction(index, count));
        tokio::time::sleep_until(began + due).await;
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            break;
        };
        let clients = Arc::clone(&clients);
        let key = format!("{run}-{index}");
        tasks.push(tokio::spawn(async move {
            let started = start(&clients, index, key).await;
            drop(slot);
            started
        }));
    }
    let mut started = Vec::with_capacity(count);
    for task in tasks {
        started.push(
            task.await
                .unwrap_or_else(|e| Err(format!("a start task failed: {e}"))),
        );
    }
    started
}

/// `index / count`, as a share of a span.
#[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
fn fraction(index: usize, count: usize) -> f64 {
    index as f64 / count.max(1) as f64
}

/// Asks each client in turn until one answers in time.
async fn ask<T, F, Fut>(clients: &[Client], mut call: F) -> anyhow::Result<T>
where
    F: FnMut(Client) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let mut last = None;
    for client in clients {
        match tokio::time::timeout(REQUEST_TIMEOUT, call(client.clone())).await {
            Ok(Ok(response)) => return Ok(response.into_inner()),
            Ok(Err(status)) => last = Some(format!("{}: {}", status.code(), status.message())),
            Err(_) => last = Some(format!("no answer within {REQUEST_TIMEOUT:?}")),
        }
    }
    bail!(
        "no orchestrator answered: {}",
        last.unwrap_or_else(|| "no orchestrators".into())
    )
}

/// The invocations among `ids` that have not ended.
pub async fn unfinished(clients: &[Client], ids: &[String]) -> anyhow::Result<Vec<String>> {
    let mut running = std::collections::HashSet::new();
    let mut page_token = String::new();
    // Bounded: a page per 500 running invocations, and the workload has at most 100,000.
    for _ in 0..200 {
        let page = ask(clients, |mut client| {
            let request = pb::ListInvocationsRequest {
                page_size: 500,
                page_token: page_token.clone(),
                state: pb::InvocationState::Running.into(),
                ..Default::default()
            };
            async move { client.list_invocations(request).await }
        })
        .await?;
        running.extend(page.invocations.into_iter().map(|i| i.invocation_id));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    Ok(ids
        .iter()
        .filter(|id| running.contains(*id))
        .cloned()
        .collect())
}

/// What the API says of each of `ids` at the end: the invocation, its turns, and the
/// ledger's effects of it.
pub async fn read_back(
    clients: Arc<Vec<Client>>,
    ids: &[String],
) -> anyhow::Result<(Vec<Invocation>, Vec<LedgerEffect>, u64)> {
    let slots = Arc::new(Semaphore::new(READS_IN_FLIGHT));
    let mut tasks = Vec::with_capacity(ids.len());
    for id in ids {
        let slot = Arc::clone(&slots).acquire_owned().await?;
        let clients = Arc::clone(&clients);
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            let read = read_one(&clients, &id).await;
            drop(slot);
            read
        }));
    }
    let (mut invocations, mut effects, mut turns) = (Vec::new(), Vec::new(), 0);
    for task in tasks {
        let (invocation, its_effects, its_turns) = task.await.context("a read task failed")??;
        invocations.push(invocation);
        effects.extend(its_effects);
        turns += its_turns;
    }
    Ok((invocations, effects, turns))
}

async fn read_one(
    clients: &[Client],
    id: &str,
) -> anyhow::Result<(Invocation, Vec<LedgerEffect>, u64)> {
    let got = ask(clients, |mut client| {
        let request = pb::GetInvocationRequest {
            invocation_id: id.to_owned(),
        };
        async move { client.get_invocation(request).await }
    })
    .await?
    .invocation
    .with_context(|| format!("{id}: the answer held no invocation"))?;
    let ended = got.state() == pb::InvocationState::Ended;
    let invocation = Invocation {
        id: id.to_owned(),
        reason: ended.then(|| agentloop_wire::reason_name(got.terminal_reason)),
        writes: vec![WRITE_CALL.to_owned()],
    };
    let turns = got.usage.map_or(0, |usage| u64::from(usage.steps));
    let mut effects = Vec::new();
    let mut page_token = String::new();
    // Bounded: the invocation makes one write.
    for _ in 0..10 {
        let page = ask(clients, |mut client| {
            let request = pb::ListEffectsRequest {
                invocation_id: id.to_owned(),
                page_size: 100,
                page_token: page_token.clone(),
            };
            async move { client.list_effects(request).await }
        })
        .await?;
        effects.extend(page.entries.into_iter().map(|entry| LedgerEffect {
            state: agentloop_wire::effect_state_name(entry.state),
            invocation_id: entry.invocation_id,
            call_id: entry.call_id,
            effect_key: entry.effect_key,
        }));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    Ok((invocation, effects, turns))
}
