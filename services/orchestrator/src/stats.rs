//! The aggregates of a window of invocations (`GetInvocationStats`): what an operator's
//! overview shows. Folded one stored record at a time, so that reading many invocations
//! keeps only a duration per ended run, never the runs themselves.

use std::collections::BTreeMap;
use std::time::Duration;

use agentloop_engine::{TerminalReason, nearest_rank};
use agentloop_proto::v1 as pb;
use agentloop_store::{EventStore, InvocationRecord, InvocationState, ListRequest, StoreError};
use agentloop_wire as wire;

/// Most invocations one `GetInvocationStats` reads: the newest of its window.
pub(crate) const MAX_INVOCATIONS: usize = 10_000;
/// Invocations read from the store at a time: what one read holds in memory.
pub(crate) const PAGE: usize = 100;

/// The aggregates of the invocations `scope` selects (its limit and cursor are set
/// here): the newest `bound` of them, read `page` at a time, and whether the window
/// held more.
pub(crate) async fn read(
    store: &dyn EventStore,
    scope: ListRequest,
    bound: usize,
    page: usize,
) -> Result<pb::GetInvocationStatsResponse, StoreError> {
    let mut tally = Tally::default();
    let (mut read, mut before) = (0, None);
    // One more than the bound in all: that one tells whether there are more.
    let truncated = loop {
        let wanted = (bound + 1 - read).min(page.max(1));
        let records = store
            .list(ListRequest {
                limit: u32::try_from(wanted).unwrap_or(u32::MAX),
                before,
                ..scope.clone()
            })
            .await?;
        for record in records.iter().take(bound - read) {
            tally.add(record);
        }
        let seen = read + records.len();
        read = seen.min(bound);
        if seen > bound {
            break true;
        }
        if records.len() < wanted {
            break false;
        }
        before = records.last().map(|record| record.invocation_id);
    };
    Ok(tally.response(truncated))
}

/// The running sums of the invocations read so far.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    read: u32,
    running: u32,
    waiting: u32,
    /// The duration of each ended run, in milliseconds, by its reason.
    ended: BTreeMap<TerminalReason, Vec<u64>>,
    completed: Sums,
}

#[derive(Debug, Default)]
struct Sums {
    runs: u32,
    turns: u64,
    tool_calls: u64,
    input_tokens: u64,
    output_tokens: u64,
    cost_micro_usd: u64,
}

impl Tally {
    pub(crate) fn add(&mut self, record: &InvocationRecord) {
        self.read = self.read.saturating_add(1);
        let reason = record.end.as_ref().map(|end| end.reason);
        match (record.state, reason) {
            (InvocationState::Running, _) => self.running = self.running.saturating_add(1),
            (InvocationState::Waiting, _) => self.waiting = self.waiting.saturating_add(1),
            // An ended record always has its end; one without is counted as running.
            (InvocationState::Ended, None) => self.running = self.running.saturating_add(1),
            (InvocationState::Ended, Some(reason)) => {
                let took = record.updated_at.0.saturating_sub(record.created_at.0);
                self.ended.entry(reason).or_default().push(took);
                if reason == TerminalReason::Completed {
                    let totals = &record.totals;
                    let sums = &mut self.completed;
                    sums.runs = sums.runs.saturating_add(1);
                    sums.turns = sums.turns.saturating_add(u64::from(totals.steps));
                    sums.tool_calls = sums.tool_calls.saturating_add(u64::from(totals.tool_calls));
                    sums.input_tokens = sums.input_tokens.saturating_add(totals.input_tokens);
                    sums.output_tokens = sums.output_tokens.saturating_add(totals.output_tokens);
                    sums.cost_micro_usd = sums.cost_micro_usd.saturating_add(totals.cost.0);
                }
            }
        }
    }

    /// The answer, `truncated` when the window held more than was read.
    pub(crate) fn response(self, truncated: bool) -> pb::GetInvocationStatsResponse {
        let ended: usize = self.ended.values().map(Vec::len).sum();
        let no_progress = self
            .ended
            .get(&TerminalReason::NoProgress)
            .map_or(0, Vec::len);
        let mut by_reason: Vec<pb::ReasonStats> = self
            .ended
            .into_iter()
            .map(|(reason, mut durations)| {
                durations.sort_unstable();
                let at = |percent| duration(nearest_rank(&durations, percent));
                pb::ReasonStats {
                    reason: wire::terminal_reason(reason).into(),
                    count: u32::try_from(durations.len()).unwrap_or(u32::MAX),
                    p50: at(50),
                    p95: at(95),
                    p99: at(99),
                }
            })
            .collect();
        // Most frequent first; the reason's order among equals, so the answer is stable.
        by_reason.sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
        let sums = self.completed;
        let per_run = |sum: u64| match sums.runs {
            0 => 0.0,
            runs => sum as f64 / f64::from(runs),
        };
        pb::GetInvocationStatsResponse {
            invocations: self.read,
            truncated,
            running: self.running,
            waiting: self.waiting,
            by_reason,
            completed: Some(pb::RunCosts {
                runs: sums.runs,
                turns: per_run(sums.turns),
                tool_calls: per_run(sums.tool_calls),
                input_tokens: per_run(sums.input_tokens),
                output_tokens: per_run(sums.output_tokens),
                cost_micro_usd: per_run(sums.cost_micro_usd),
            }),
            no_progress_rate: match ended {
                0 => 0.0,
                ended => no_progress as f64 / ended as f64,
            },
        }
    }
}

fn duration(millis: u64) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(Duration::from_millis(millis)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentloop_engine::{EndRecord, Totals, UnixMillis};
    use uuid::Uuid;

    fn record(
        state: InvocationState,
        reason: Option<TerminalReason>,
        took: u64,
    ) -> InvocationRecord {
        InvocationRecord {
            invocation_id: Uuid::now_v7(),
            tenant: "t".into(),
            idempotency_key: None,
            request_digest: String::new(),
            spec: String::new(),
            state,
            version: 1,
            lease_epoch: 1,
            totals: Totals {
                steps: 2,
                tool_calls: 3,
                input_tokens: 100,
                output_tokens: 10,
                turn_events: 2,
                cost: agentloop_engine::MicroUsd(7),
            },
            end: reason.map(|reason| EndRecord {
                reason,
                detail: String::new(),
                answer: None,
                proposal: None,
                wait: None,
                accepted_by: Vec::new(),
                input: None,
            }),
            cancel_requested_at: None,
            cancel_reason: String::new(),
            created_at: UnixMillis(1_000),
            updated_at: UnixMillis(1_000 + took),
        }
    }

    #[test]
    fn a_window_is_counted_by_state_and_reason() {
        let mut tally = Tally::default();
        for took in [10, 20, 30, 40] {
            tally.add(&record(
                InvocationState::Ended,
                Some(TerminalReason::Completed),
                took,
            ));
        }
        tally.add(&record(
            InvocationState::Ended,
            Some(TerminalReason::NoProgress),
            500,
        ));
        tally.add(&record(
            InvocationState::Waiting,
            Some(TerminalReason::ApprovalRequired),
            5,
        ));
        tally.add(&record(InvocationState::Running, None, 0));
        let stats = tally.response(false);
        assert_eq!((stats.invocations, stats.running, stats.waiting), (7, 1, 1));
        let completed = &stats.by_reason[0];
        assert_eq!(completed.reason(), pb::TerminalReason::Completed);
        assert_eq!(completed.count, 4);
        let millis = |d: &Option<prost_types::Duration>| d.as_ref().map(|d| d.nanos / 1_000_000);
        assert_eq!(millis(&completed.p50), Some(20));
        assert_eq!(millis(&completed.p99), Some(40));
        assert_eq!(stats.by_reason[1].reason(), pb::TerminalReason::NoProgress);
        assert_eq!(stats.by_reason.len(), 2, "waits are not ends");
        assert!((stats.no_progress_rate - 0.2).abs() < 1e-9);
        let costs = stats.completed.unwrap_or_default();
        assert_eq!(costs.runs, 4);
        assert!((costs.turns - 2.0).abs() < 1e-9 && (costs.cost_micro_usd - 7.0).abs() < 1e-9);
    }

    /// The newest `bound` of a window are read, page by page, and the answer says
    /// whether the window held more; the scope's tenant is kept on every page.
    #[tokio::test]
    async fn a_window_is_read_up_to_its_bound_and_says_when_it_held_more() {
        let dir = tempfile::tempdir().unwrap();
        let store = agentloop_store::SqliteStore::open_in(dir.path())
            .await
            .unwrap();
        for (n, tenant) in ["a", "a", "b", "a", "a", "a"].into_iter().enumerate() {
            let created = store
                .create(agentloop_store::NewInvocation {
                    invocation_id: Uuid::now_v7(),
                    tenant: tenant.into(),
                    idempotency_key: None,
                    request_digest: format!("d{n}"),
                    spec: "{}".into(),
                    created_at: UnixMillis(1_000 + n as u64),
                })
                .await
                .unwrap();
            assert!(matches!(created, agentloop_store::Created::New(_)));
        }
        let scope = ListRequest {
            tenant: Some("a".into()),
            ..ListRequest::default()
        };
        for (bound, page, read, truncated) in [
            (3, 2, 3, true),
            (4, 2, 4, true),
            (5, 2, 5, false),
            (5, 5, 5, false),
            (9, 2, 5, false),
            (4, 100, 4, true),
        ] {
            let stats = read_window(&store, &scope, bound, page).await;
            assert_eq!(
                (stats.invocations, stats.truncated),
                (read, truncated),
                "bound {bound}, page {page}"
            );
        }
    }

    async fn read_window(
        store: &agentloop_store::SqliteStore,
        scope: &ListRequest,
        bound: usize,
        page: usize,
    ) -> pb::GetInvocationStatsResponse {
        read(store, scope.clone(), bound, page).await.unwrap()
    }

    #[test]
    fn nothing_read_is_zeros_not_a_division_by_zero() {
        let stats = Tally::default().response(false);
        assert_eq!(stats.invocations, 0);
        assert!(stats.by_reason.is_empty());
        assert!(stats.no_progress_rate.abs() < f64::EPSILON);
        assert_eq!(stats.completed.unwrap_or_default().runs, 0);
    }
}
