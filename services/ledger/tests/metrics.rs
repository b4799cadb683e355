//! The ledger's effect metrics, on SQLite and PostgreSQL: every move counts under the
//! state it reached, and the unresolved effects are counted in the database by state.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use agentloop_ledger::{LedgerService, LedgerStore, StoreOptions, effect_key};
use agentloop_proto::v1::effect_ledger_service_server::EffectLedgerService;
use agentloop_proto::v1::{EffectState, MarkDispatchedRequest, PrepareRequest, RecordRequest};
use agentloop_store::testing::PostgresServer;
use agentloop_telemetry::Telemetry;
use tonic::Request;

/// The value of the sample `name{labels}` in `text`; 0 when it is absent.
fn sample(text: &str, series: &str) -> f64 {
    agentloop_telemetry::metrics::sample(text, series).unwrap_or(0.0)
}

async fn effects_are_counted_by_state(store: LedgerStore) {
    let telemetry = Telemetry::off();
    let ledger = LedgerService::new(store).with_telemetry(&telemetry);
    ledger.count_unresolved().await.unwrap();
    let unresolved = |text: &str, state: &str| {
        sample(
            text,
            &format!("agentloop_effects_unresolved{{state=\"{state}\"}}"),
        )
    };
    let text = telemetry.metrics().encode();
    for state in [
        "prepared",
        "dispatched",
        "outcome_unknown",
        "reconciliation_required",
    ] {
        assert!(
            text.contains(&format!(
                "agentloop_effects_unresolved{{state=\"{state}\"}} 0"
            )),
            "an empty ledger has no {state} effect:\n{text}"
        );
    }

    // Three effects: one committed, one left dispatched, one left prepared.
    for call in ["a", "b", "c"] {
        let key = effect_key("inv", call);
        ledger
            .prepare(Request::new(PrepareRequest {
                invocation_id: "inv".into(),
                call_id: call.into(),
                effect_key: key.clone(),
                tool: "crm.update".into(),
            }))
            .await
            .unwrap();
        if call == "c" {
            continue;
        }
        ledger
            .mark_dispatched(Request::new(MarkDispatchedRequest {
                effect_key: key.clone(),
                expected_state: EffectState::Prepared as i32,
            }))
            .await
            .unwrap();
        if call == "a" {
            ledger
                .record(Request::new(RecordRequest {
                    effect_key: key,
                    expected_state: EffectState::Dispatched as i32,
                    state: EffectState::Committed as i32,
                    receipt: "rev-1".into(),
                    detail: String::new(),
                }))
                .await
                .unwrap();
        }
    }
    // A prepare repeated moves nothing, and neither does a refused move.
    ledger
        .prepare(Request::new(PrepareRequest {
            invocation_id: "inv".into(),
            call_id: "a".into(),
            effect_key: effect_key("inv", "a"),
            tool: "crm.update".into(),
        }))
        .await
        .unwrap();
    ledger
        .mark_dispatched(Request::new(MarkDispatchedRequest {
            effect_key: effect_key("inv", "a"),
            expected_state: EffectState::Prepared as i32,
        }))
        .await
        .unwrap_err();

    let text = telemetry.metrics().encode();
    let moved = |state: &str| {
        sample(
            &text,
            &format!("agentloop_effect_transitions_total{{state=\"{state}\"}}"),
        )
    };
    assert_eq!(moved("prepared"), 3.0, "{text}");
    assert_eq!(moved("dispatched"), 2.0, "{text}");
    assert_eq!(moved("committed"), 1.0, "{text}");
    assert_eq!(
        unresolved(&text, "prepared"),
        0.0,
        "counted only when asked"
    );

    ledger.count_unresolved().await.unwrap();
    let text = telemetry.metrics().encode();
    assert_eq!(unresolved(&text, "prepared"), 1.0, "{text}");
    assert_eq!(unresolved(&text, "dispatched"), 1.0, "{text}");
    assert_eq!(unresolved(&text, "outcome_unknown"), 0.0, "{text}");
}

#[tokio::test]
async fn effects_are_counted_by_state_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = LedgerStore::open_sqlite(&dir.path().join("ledger.db"), &StoreOptions::default())
        .await
        .unwrap();
    effects_are_counted_by_state(store).await;
}

#[tokio::test]
async fn effects_are_counted_by_state_on_postgres() {
    let Some(server) = PostgresServer::for_test("effects_are_counted_by_state_on_postgres").await
    else {
        return;
    };
    let database = server.create_database().await.unwrap();
    let store = LedgerStore::connect_postgres(database.url(), &StoreOptions::default())
        .await
        .unwrap();
    effects_are_counted_by_state(store).await;
}
