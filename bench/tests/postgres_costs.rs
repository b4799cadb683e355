//! What the runtime asks of PostgreSQL, counted on the wire by the cluster bench's proxy:
//! a group of turns is one statement whatever its size, a claim is one, a read of the log
//! is one, and an effect the ledger records (prepared, dispatched, committed) is three.
//! Beside them, sqlx's pool pings every connection it is given back (a bare `Sync` after
//! the caller is done), so pings are bounded by the uses, not counted as the statements'
//! round trips. Skips loudly without a server unless `AGENTLOOP_REQUIRE_POSTGRES=1`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm
)]

use agentloop_bench::wire::{CountingProxy, Protocol, through, upstream};
use agentloop_ledger::{EffectState, LedgerStore, NewEffect, Outcome, StoreOptions};
use agentloop_store::conformance::{append_of, lookup_turn, new_invocations, until_queued};
use agentloop_store::testing::PostgresServer;
use agentloop_store::{EventStore, PgOptions, PgStore};
use futures::future::join_all;

/// A proxy in front of a fresh database of `server`, and the URL that goes through it.
async fn counted(server: &PostgresServer) -> (CountingProxy, String, impl Sized) {
    let database = server.create_database().await.unwrap();
    let url = database.url().to_owned();
    let proxy = CountingProxy::start(
        Protocol::Postgres,
        upstream(&url, Protocol::Postgres).unwrap(),
    )
    .await
    .unwrap();
    let proxied = through(&url, proxy.address()).unwrap();
    (proxy, proxied, database)
}

#[tokio::test]
async fn what_turns_and_effects_ask_of_postgres() {
    let Some(server) = PostgresServer::for_test("postgres_costs").await else {
        return;
    };
    a_group_of_turns_is_one_statement_and_a_claim_is_one(&server).await;
    an_effect_recorded_by_the_ledger_is_three_statements(&server).await;
}

async fn a_group_of_turns_is_one_statement_and_a_claim_is_one(server: &PostgresServer) {
    let (proxy, url, _database) = counted(server).await;
    let store = PgStore::connect(PgOptions::new(url)).await.unwrap();
    const INVOCATIONS: u64 = 20;
    const ROUNDS: u64 = 10;
    let ids = new_invocations(&store, INVOCATIONS).await;

    // A watch's first read of a new invocation, and a read of an unknown one.
    let before = proxy.counts();
    assert!(store.events(ids[0], 1, 100).await.unwrap().is_empty());
    let unknown = store.events(uuid::Uuid::now_v7(), 1, 100).await;
    assert!(matches!(
        unknown,
        Err(agentloop_store::StoreError::NotFound(_))
    ));
    assert_eq!(proxy.counts().since(&before).statements, 2, "one each");

    let before = proxy.counts();
    for id in &ids {
        store.claim(*id, 1).await.unwrap();
    }
    let claims = proxy.counts().since(&before);
    assert_eq!(claims.statements, INVOCATIONS, "{claims:?}");
    // A connection prepares the statement once, in a round trip of its own.
    let connections = u64::from(agentloop_store::DEFAULT_MAX_CONNECTIONS);
    assert!(
        claims.round_trips - claims.pings <= INVOCATIONS + connections,
        "{claims:?}"
    );
    assert!(claims.pings <= INVOCATIONS, "{claims:?}");

    let before = proxy.counts();
    for round in 0..ROUNDS {
        let events = [lookup_turn(round + 1, u32::try_from(round).unwrap() + 1)];
        let hold = store.hold_commits().await.unwrap();
        let mut appends = std::pin::pin!(join_all(
            ids.iter()
                .map(|id| store.append(*id, append_of(round, 1, &events)))
        ));
        until_queued(appends.as_mut(), ids.len(), || hold.queued()).await;
        hold.release();
        assert!(appends.await.iter().all(Result::is_ok));
    }
    let turns = proxy.counts().since(&before);
    assert_eq!(turns.statements, ROUNDS, "one per group: {turns:?}");
    assert_eq!(turns.statements_by_kind.get("WITH"), Some(&ROUNDS));
    // Each committer connection prepares the group's statement once.
    assert!(turns.round_trips - turns.pings <= ROUNDS + 4, "{turns:?}");
    assert!(turns.pings <= ROUNDS, "{turns:?}");
    assert_eq!(store.commit_stats().largest_group, INVOCATIONS);
}

async fn an_effect_recorded_by_the_ledger_is_three_statements(server: &PostgresServer) {
    let (proxy, url, _database) = counted(server).await;
    let ledger = LedgerStore::connect_postgres(&url, &StoreOptions::default())
        .await
        .unwrap();
    const WRITES: u64 = 10;
    let before = proxy.counts();
    for write in 0..WRITES {
        let key = format!("effect-{write}");
        let new = NewEffect {
            invocation_id: "invocation".to_owned(),
            call_id: format!("call-{write}"),
            effect_key: key.clone(),
            tool: "transfer".to_owned(),
        };
        let (_, created) = ledger.prepare(&new).await.unwrap();
        assert!(created);
        ledger
            .mark_dispatched(&key, EffectState::Prepared)
            .await
            .unwrap();
        let entry = ledger
            .record(
                &key,
                EffectState::Dispatched,
                Outcome::Committed,
                "receipt",
                "",
            )
            .await
            .unwrap();
        assert_eq!(entry.state, EffectState::Committed);
    }
    let costs = proxy.counts().since(&before);
    assert_eq!(costs.statements, 3 * WRITES, "{costs:?}");
    // The three statements are each prepared once per connection.
    let connections = u64::from(StoreOptions::default().max_connections);
    assert!(
        costs.round_trips - costs.pings <= 3 * WRITES + 3 * connections,
        "{costs:?}"
    );
    assert!(costs.pings <= 3 * WRITES, "{costs:?}");
}
