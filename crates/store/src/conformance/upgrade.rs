//! Upgrades: an invocation written with an earlier release's schema goes on after the
//! upgrade. Not in [`CHECKS`](super::CHECKS): each backend's test writes the old schema.

use agentloop_engine::Totals;
use uuid::Uuid;

use crate::{Created, EventStore};

use super::fixtures::{TENANT, append_of, id_at, lookup_turn, new_invocation};

/// The invocation an upgrade test writes with an earlier release's schema, before it
/// upgrades: (idempotency key, request digest, spec).
pub const EARLIER_ROW: (&str, &str, &str) =
    ("key-1", "digest-1", r#"{"goal":"old","tenant":"acme"}"#);

/// Writes [`EARLIER_ROW`] into the invocations table of the schema before the spec moved
/// out of it, through `executor` (a SQLite or PostgreSQL connection: the statement is the
/// same in both), and returns the invocation's ID. The values are literals: the test's own
/// constants.
pub async fn write_earlier_row<'e, E: sqlx::Executor<'e>>(executor: E) -> Uuid {
    let (key, digest, spec) = EARLIER_ROW;
    let id = id_at(5_000);
    let totals = serde_json::to_string(&Totals::default()).unwrap();
    let insert = format!(
        "INSERT INTO invocations (invocation_id, idempotency_key, request_digest, spec, state, \
         version, lease_epoch, totals, end_record, created_at, updated_at) \
         VALUES ('{}', '{key}', '{digest}', '{spec}', 'running', 0, 0, '{totals}', NULL, \
         5000, 5000)",
        id.hyphenated()
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(insert))
        .execute(executor)
        .await
        .unwrap();
    id
}

/// After an upgrade: invocation `id`, written as [`EARLIER_ROW`] describes, is whole, its
/// key still finds it, and it takes appends.
pub async fn earlier_row_goes_on(store: &dyn EventStore, id: Uuid) {
    let (key, digest, spec) = EARLIER_ROW;
    let record = store.get(id).await.unwrap();
    assert_eq!(record.spec, spec);
    assert_eq!(record.tenant, TENANT, "the tenant comes from the spec");
    assert_eq!(record.request_digest, digest);
    assert_eq!(record.idempotency_key.as_deref(), Some(key));
    let mut again = new_invocation(6_000, Some(key), digest);
    again.spec = spec.to_owned();
    assert!(matches!(
        store.create(again).await.unwrap(),
        Created::Existing(existing) if existing.invocation_id == id
    ));
    store
        .append(id, append_of(0, 1, &[lookup_turn(1, 1)]))
        .await
        .unwrap();
    assert_eq!(store.get(id).await.unwrap().version, 1);
}
