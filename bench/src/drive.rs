//! Driving the workload: starting invocations, following each to its end, parking them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::{
    BenchOptions, Figures, PARK_POLL, PARK_STARTERS, ParkReport, RUN_TIMEOUT,
    deployment::{Client, Deployment},
    measure::{Histogram, process_status},
    model::{Gate, answer_from, expected_answer},
};
use agentloop_proto::v1 as pb;
use agentloop_store::EventStore;
use anyhow::Context;
use futures::StreamExt;
use tokio::task::JoinSet;

/// What one invocation showed its watcher.
pub(crate) struct Observed {
    pub(crate) turns: u64,
    /// Commit-to-commit gaps, in microseconds.
    pub(crate) gaps: Vec<u64>,
    pub(crate) total: Duration,
    pub(crate) failure: Option<String>,
}

/// Starts one invocation, follows it to its end and checks it: its answer, and what
/// its last lookups returned (which the answer must have been built from).
pub(crate) async fn follow(
    client: Client,
    start: pb::StartInvocationRequest,
    turns: u32,
) -> Observed {
    let started = Instant::now();
    let mut observed = Observed {
        turns: 0,
        gaps: Vec::with_capacity(turns as usize),
        total: Duration::ZERO,
        failure: None,
    };
    // Boxed: the in-process API's start is a large future, which would otherwise be
    // inlined into every invocation's follower for its whole life (about 2.4 KB of the
    // bench client's own memory per invocation, counted in the process's peak).
    let stream = match Box::pin(client.start(start)).await {
        Ok(id) => client.watch(id).await,
        Err(status) => Err(status),
    };
    let mut stream = match stream {
        Ok(stream) => stream,
        Err(status) => {
            observed.failure = Some(format!("start or watch failed: {status}"));
            return observed;
        }
    };
    let mut last: Option<Duration> = None;
    let mut lookups: Option<pb::Event> = None;
    let mut end = None;
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(response) => response.event,
            Err(status) => {
                observed.failure = Some(format!("watch failed: {status}"));
                return observed;
            }
        };
        let Some(event) = event else { continue };
        // The last turn commits its `Turn` and the `Ended` event together.
        match event.body {
            Some(pb::event::Body::Turn(ref turn)) => {
                observed.turns += 1;
                let committed = event.committed_at.map_or(Duration::ZERO, |at| {
                    Duration::new(
                        u64::try_from(at.seconds).unwrap_or(0),
                        u32::try_from(at.nanos).unwrap_or(0),
                    )
                });
                if let Some(previous) = last {
                    let gap = committed.saturating_sub(previous).as_micros();
                    observed.gaps.push(u64::try_from(gap).unwrap_or(u64::MAX));
                }
                last = Some(committed);
                if !turn.results.is_empty() {
                    lookups = Some(event);
                }
            }
            Some(pb::event::Body::Ended(ended)) => {
                end = Some(ended);
                break;
            }
            Some(_) | None => {}
        }
    }
    observed.total = started.elapsed();
    let expected = expected_answer(turns);
    let looked_up = answer_from(lookups.as_slice());
    observed.failure = match end {
        None => Some("the watch ended before the invocation did".to_owned()),
        Some(ended) if ended.reason() != pb::TerminalReason::Completed => {
            Some(format!("ended {:?}: {}", ended.reason(), ended.detail))
        }
        Some(ended) if ended.answer.as_deref() != Some(expected.as_str()) => {
            Some(format!("answer {:?}, expected {expected:?}", ended.answer))
        }
        Some(_) if looked_up != expected => Some(format!(
            "the last lookups returned {looked_up:?}, expected {expected:?}"
        )),
        Some(_) if observed.turns != u64::from(turns) => Some(format!(
            "{} turns committed, expected {turns}",
            observed.turns
        )),
        Some(_) => None,
    };
    observed
}

pub(crate) async fn drive(
    deployment: &Deployment,
    options: &BenchOptions,
) -> anyhow::Result<Figures> {
    let cpu_before = deployment.cpu_time()?;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for (_, client) in (0..options.invocations).zip(deployment.clients.iter().cycle()) {
        tasks.spawn(follow(
            client.clone(),
            deployment.start.clone(),
            options.turns,
        ));
    }
    let mut figures = Figures {
        completed: 0,
        first_failure: None,
        turns: 0,
        elapsed: Duration::ZERO,
        cpu: Duration::ZERO,
        turn_latency: Histogram::default(),
        invocation_latency: Histogram::default(),
        park: None,
    };
    let collect = async {
        while let Some(joined) = tasks.join_next().await {
            let observed = joined.context("an invocation's driver panicked")?;
            figures.turns += observed.turns;
            for gap in &observed.gaps {
                figures.turn_latency.record(*gap);
            }
            figures
                .invocation_latency
                .record(u64::try_from(observed.total.as_micros()).unwrap_or(u64::MAX));
            match observed.failure {
                None => figures.completed += 1,
                Some(failure) => {
                    figures.first_failure.get_or_insert(failure);
                }
            }
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(RUN_TIMEOUT, collect)
        .await
        .context("the run took longer than an hour")??;
    deployment.flush_spans().await;
    figures.elapsed = started.elapsed();
    figures.cpu = deployment.cpu_time()?.saturating_sub(cpu_before);
    Ok(figures)
}

/// Park mode: start all, wait until all wait, measure, release, wait for the end.
pub(crate) async fn park(
    deployment: &Deployment,
    options: &BenchOptions,
    gate: &Gate,
) -> anyhow::Result<Figures> {
    let total = u64::from(options.invocations);
    let stack = deployment.stack()?;
    let rss_before = process_status("self", "VmRSS:").context("cannot read VmRSS")?;
    let cpu_before = deployment.cpu_time()?;
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut starters = JoinSet::new();
    for _ in 0..PARK_STARTERS {
        let (client, next) = (deployment.clients[0].clone(), Arc::clone(&next));
        let start = deployment.start.clone();
        starters.spawn(async move {
            while next.fetch_add(1, Relaxed) < total {
                client.start(start.clone()).await?;
            }
            Ok::<(), tonic::Status>(())
        });
    }
    while let Some(joined) = starters.join_next().await {
        joined.context("a starter panicked")??;
    }
    let mut waiting = gate.waiting.subscribe();
    tokio::time::timeout(RUN_TIMEOUT, waiting.wait_for(|n| *n >= total))
        .await
        .context("the invocations did not all park within an hour")??;
    let rss_parked = process_status("self", "VmRSS:").context("cannot read VmRSS")?;
    gate.released.send_replace(true);

    // T turns, the last one committed with the `Ended` event.
    let expected_events = total * (u64::from(options.turns) + 1);
    let finished = async {
        loop {
            let stats = stack.store().stats();
            if stack.store().running(None, 1).await?.is_empty() {
                return anyhow::Ok(stats);
            }
            tokio::time::sleep(PARK_POLL).await;
        }
    };
    tokio::time::timeout(RUN_TIMEOUT, finished)
        .await
        .context("the released invocations did not end within an hour")??;
    deployment.flush_spans().await;
    let elapsed = started.elapsed();
    let storage = stack.store().storage().await?;
    // Each invocation commits at most T + 1 events (its step budget is T); all of them
    // means every invocation got to its answer.
    let complete = storage.events == expected_events;
    Ok(Figures {
        completed: if complete { total } else { 0 },
        first_failure: (!complete).then(|| {
            format!(
                "{} events committed, expected {expected_events}",
                storage.events
            )
        }),
        turns: storage.events.saturating_sub(total),
        elapsed,
        cpu: deployment.cpu_time()?.saturating_sub(cpu_before),
        turn_latency: Histogram::default(),
        invocation_latency: Histogram::default(),
        park: Some(ParkReport {
            parked: total,
            rss_before_bytes: rss_before,
            rss_parked_bytes: rss_parked,
            bytes_per_parked_invocation: rss_parked.saturating_sub(rss_before) as f64
                / total as f64,
        }),
    })
}
