//! The ledger over real gRPC on 127.0.0.1 port 0, through `agentloop_ledger::run`, on
//! the SQLite file of its data directory or on PostgreSQL when `database_url` is set.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use std::net::SocketAddr;

use agentloop_ledger::{LedgerConfig, LedgerStore, StoreOptions, effect_key};
use agentloop_proto::v1::effect_ledger_service_client::EffectLedgerServiceClient;
use agentloop_proto::v1::{
    EffectState, GetRequest, ListByInvocationRequest, ListUnresolvedRequest, MarkDispatchedRequest,
    PrepareRequest, RecordRequest,
};
use agentloop_store::testing::PostgresServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::Code;
use tonic::transport::Channel;

struct Ledger {
    client: EffectLedgerServiceClient<Channel>,
    stop: oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<Result<(), agentloop_ledger::RunError>>,
    _dir: tempfile::TempDir,
}

async fn start() -> Ledger {
    start_with(None).await
}

/// A ledger on a fresh data directory, or on `database_url` when given.
async fn start_with(database_url: Option<String>) -> Ledger {
    let dir = tempfile::tempdir().unwrap();
    let config = LedgerConfig {
        data_dir: dir.path().join("data"),
        database_url,
        ..LedgerConfig::default()
    };
    config.validate().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        agentloop_ledger::run(
            listener,
            &config,
            agentloop_server::Access::default(),
            async {
                let _ = stopped.await;
            },
        )
        .await
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Ledger {
        client: EffectLedgerServiceClient::new(channel),
        stop,
        handle,
        _dir: dir,
    }
}

impl Ledger {
    async fn stop(self) {
        drop(self.client);
        self.stop.send(()).unwrap();
        self.handle.await.unwrap().unwrap();
    }
}

fn prepare(invocation: &str, call: &str) -> PrepareRequest {
    PrepareRequest {
        invocation_id: invocation.into(),
        call_id: call.into(),
        effect_key: effect_key(invocation, call),
        tool: "crm.update".into(),
    }
}

#[tokio::test]
async fn happy_path_prepare_dispatch_commit_get() {
    let mut ledger = start().await;
    let request = prepare("inv-1", "call-1");
    let key = request.effect_key.clone();

    let prepared = ledger
        .client
        .prepare(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(prepared.created);
    let entry = prepared.entry.unwrap();
    assert_eq!(entry.state, EffectState::Prepared as i32);
    assert_eq!(entry.attempt, 0);
    assert!(entry.created_at.is_some());

    let entry = ledger
        .client
        .mark_dispatched(MarkDispatchedRequest {
            effect_key: key.clone(),
            expected_state: EffectState::Prepared as i32,
        })
        .await
        .unwrap()
        .into_inner()
        .entry
        .unwrap();
    assert_eq!(
        (entry.state, entry.attempt),
        (EffectState::Dispatched as i32, 1)
    );

    let entry = ledger
        .client
        .record(RecordRequest {
            effect_key: key.clone(),
            expected_state: EffectState::Dispatched as i32,
            state: EffectState::Committed as i32,
            receipt: "crm-rev-42".into(),
            detail: "updated".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .entry
        .unwrap();
    assert_eq!(entry.state, EffectState::Committed as i32);

    let got = ledger
        .client
        .get(GetRequest { effect_key: key })
        .await
        .unwrap()
        .into_inner()
        .entry
        .unwrap();
    assert_eq!(got, entry);
    assert_eq!(got.receipt, "crm-rev-42");
    assert_eq!(got.invocation_id, "inv-1");
    assert_eq!(got.call_id, "call-1");
    assert_eq!(got.tool, "crm.update");

    // Idempotent prepare of a committed effect returns it unchanged.
    let again = ledger.client.prepare(request).await.unwrap().into_inner();
    assert!(!again.created);
    assert_eq!(again.entry.unwrap(), got);
    ledger.stop().await;
}

#[tokio::test]
async fn illegal_transition_is_failed_precondition_naming_both_states() {
    let mut ledger = start().await;
    let request = prepare("inv-1", "call-1");
    let key = request.effect_key.clone();
    ledger.client.prepare(request).await.unwrap();

    let status = ledger
        .client
        .record(RecordRequest {
            effect_key: key.clone(),
            expected_state: EffectState::Prepared as i32,
            state: EffectState::Committed as i32,
            receipt: String::new(),
            detail: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("PREPARED"), "{status:?}");
    assert!(status.message().contains("COMMITTED"), "{status:?}");

    let status = ledger
        .client
        .record(RecordRequest {
            effect_key: key.clone(),
            expected_state: EffectState::Dispatched as i32,
            state: EffectState::Committed as i32,
            receipt: String::new(),
            detail: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status
            .message()
            .contains("expected state DISPATCHED, but the entry is PREPARED"),
        "{status:?}"
    );
    ledger.stop().await;
}

#[tokio::test]
async fn prepare_conflict_and_bad_input_codes() {
    let mut ledger = start().await;
    let request = prepare("inv-1", "call-1");
    ledger.client.prepare(request.clone()).await.unwrap();

    let status = ledger
        .client
        .prepare(PrepareRequest {
            call_id: "call-2".into(),
            ..request.clone()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);

    let status = ledger
        .client
        .prepare(PrepareRequest {
            invocation_id: String::new(),
            ..prepare("inv-2", "call-1")
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("invocation_id"), "{status:?}");

    let status = ledger
        .client
        .prepare(PrepareRequest {
            tool: "t".repeat(2000),
            ..prepare("inv-2", "call-1")
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);

    for (expected_state, state, field) in [
        (99, EffectState::Committed as i32, "expected_state"),
        (
            EffectState::Unspecified as i32,
            EffectState::Committed as i32,
            "expected_state",
        ),
        (
            EffectState::Dispatched as i32,
            EffectState::Prepared as i32,
            "state",
        ),
        (EffectState::Dispatched as i32, -1, "state"),
    ] {
        let status = ledger
            .client
            .record(RecordRequest {
                effect_key: request.effect_key.clone(),
                expected_state,
                state,
                receipt: String::new(),
                detail: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(field), "{status:?}");
    }

    let status = ledger
        .client
        .get(GetRequest {
            effect_key: "unknown".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    // Nothing from the failed requests was stored.
    let page = ledger
        .client
        .list_unresolved(ListUnresolvedRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.entries.len(), 1);
    assert_eq!(page.entries[0].state, EffectState::Prepared as i32);
    ledger.stop().await;
}

#[tokio::test]
async fn list_unresolved_pages_through_grpc() {
    let mut ledger = start().await;
    for i in 0..5 {
        ledger
            .client
            .prepare(prepare("inv-1", &format!("call-{i}")))
            .await
            .unwrap();
    }
    ledger
        .client
        .prepare(prepare("inv-2", "call-x"))
        .await
        .unwrap();

    let mut calls = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = ledger
            .client
            .list_unresolved(ListUnresolvedRequest {
                invocation_id: "inv-1".into(),
                page_size: 2,
                page_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 2);
        calls.extend(page.entries.into_iter().map(|e| e.call_id));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(calls, ["call-0", "call-1", "call-2", "call-3", "call-4"]);

    let status = ledger
        .client
        .list_unresolved(ListUnresolvedRequest {
            page_token: "not-a-token".into(),
            ..ListUnresolvedRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    ledger.stop().await;
}

/// What the orchestrator asks before a final answer: every entry of one invocation,
/// resolved or not, page by page; an empty ID is the caller's mistake, not an empty list.
#[tokio::test]
async fn list_by_invocation_pages_through_grpc() {
    let mut ledger = start().await;
    for i in 0..5 {
        ledger
            .client
            .prepare(prepare("inv-1", &format!("call-{i}")))
            .await
            .unwrap();
    }
    ledger
        .client
        .prepare(prepare("inv-2", "call-x"))
        .await
        .unwrap();
    let committed = effect_key("inv-1", "call-1");
    ledger
        .client
        .mark_dispatched(MarkDispatchedRequest {
            effect_key: committed.clone(),
            expected_state: EffectState::Prepared as i32,
        })
        .await
        .unwrap();
    ledger
        .client
        .record(RecordRequest {
            receipt: "rcpt-1".into(),
            ..record(
                &committed,
                EffectState::Dispatched,
                EffectState::Committed,
                "",
            )
        })
        .await
        .unwrap();

    let mut listed = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = ledger
            .client
            .list_by_invocation(ListByInvocationRequest {
                invocation_id: "inv-1".into(),
                page_size: 2,
                page_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 2);
        listed.extend(page.entries.into_iter().map(|e| (e.call_id, e.state)));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    let prepared = EffectState::Prepared as i32;
    assert_eq!(
        listed,
        [
            ("call-0".to_owned(), prepared),
            ("call-1".to_owned(), EffectState::Committed as i32),
            ("call-2".to_owned(), prepared),
            ("call-3".to_owned(), prepared),
            ("call-4".to_owned(), prepared),
        ]
    );

    let status = ledger
        .client
        .list_by_invocation(ListByInvocationRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("invocation_id"), "{status:?}");
    let status = ledger
        .client
        .list_by_invocation(ListByInvocationRequest {
            invocation_id: "inv-1".into(),
            page_token: "not-a-token".into(),
            ..ListByInvocationRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let none = ledger
        .client
        .list_by_invocation(ListByInvocationRequest {
            invocation_id: "inv-unknown".into(),
            ..ListByInvocationRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(none.entries.is_empty());
    assert!(none.next_page_token.is_empty());
    ledger.stop().await;
}

fn record(key: &str, expected: EffectState, state: EffectState, detail: &str) -> RecordRequest {
    RecordRequest {
        effect_key: key.into(),
        expected_state: expected as i32,
        state: state as i32,
        receipt: String::new(),
        detail: detail.into(),
    }
}

/// The whole operator path over the wire: a reconcile that cannot tell flags the effect,
/// ListUnresolved shows it with the reason, and only a guarded Record settles it.
async fn reconciliation_required_is_listed_until_an_operator_settles_it(ledger: &mut Ledger) {
    let request = prepare("inv-op", "call-1");
    let key = request.effect_key.clone();
    ledger.client.prepare(request).await.unwrap();
    ledger
        .client
        .mark_dispatched(MarkDispatchedRequest {
            effect_key: key.clone(),
            expected_state: EffectState::Prepared as i32,
        })
        .await
        .unwrap();
    ledger
        .client
        .record(record(
            &key,
            EffectState::Dispatched,
            EffectState::OutcomeUnknown,
            "deadline",
        ))
        .await
        .unwrap();

    let status = ledger
        .client
        .record(record(
            &key,
            EffectState::OutcomeUnknown,
            EffectState::ReconciliationRequired,
            "",
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("detail"), "{status:?}");

    let flagged = ledger
        .client
        .record(record(
            &key,
            EffectState::OutcomeUnknown,
            EffectState::ReconciliationRequired,
            "executor cannot tell",
        ))
        .await
        .unwrap()
        .into_inner()
        .entry
        .unwrap();
    assert_eq!(flagged.state, EffectState::ReconciliationRequired as i32);

    let listed = ledger
        .client
        .list_unresolved(ListUnresolvedRequest {
            invocation_id: "inv-op".into(),
            ..ListUnresolvedRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries, std::slice::from_ref(&flagged));
    assert_eq!(listed.entries[0].detail, "executor cannot tell");

    let status = ledger
        .client
        .mark_dispatched(MarkDispatchedRequest {
            effect_key: key.clone(),
            expected_state: EffectState::ReconciliationRequired as i32,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status
            .message()
            .contains("illegal transition from RECONCILIATION_REQUIRED to DISPATCHED"),
        "{status:?}"
    );

    let settled = ledger
        .client
        .record(record(
            &key,
            EffectState::ReconciliationRequired,
            EffectState::Rejected,
            "operator: not in the CRM",
        ))
        .await
        .unwrap()
        .into_inner()
        .entry
        .unwrap();
    assert_eq!(settled.state, EffectState::Rejected as i32);
    let listed = ledger
        .client
        .list_unresolved(ListUnresolvedRequest {
            invocation_id: "inv-op".into(),
            ..ListUnresolvedRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(listed.entries.is_empty());
}

#[tokio::test]
async fn reconciliation_required_over_grpc_on_sqlite() {
    let mut ledger = start().await;
    reconciliation_required_is_listed_until_an_operator_settles_it(&mut ledger).await;
    ledger.stop().await;
}

#[tokio::test]
async fn database_url_serves_the_ledger_from_postgres() {
    let Some(server) =
        PostgresServer::for_test("database_url_serves_the_ledger_from_postgres").await
    else {
        return;
    };
    let database = server.create_database().await.unwrap();
    let mut ledger = start_with(Some(database.url().to_owned())).await;
    reconciliation_required_is_listed_until_an_operator_settles_it(&mut ledger).await;
    ledger.stop().await;

    // The entries are in PostgreSQL, not in the (unused) data directory.
    let store = LedgerStore::connect_postgres(database.url(), &StoreOptions::default())
        .await
        .unwrap();
    let entry = store.get(&effect_key("inv-op", "call-1")).await.unwrap();
    assert_eq!(entry.state, agentloop_ledger::EffectState::Rejected);
    store.close().await;
}
