-- no-transaction
-- Invocations that wait for a human, and why a cancel was asked for.
--
-- `state` may now be 'waiting': the run stopped for an approval or an answer, and a
-- reply resumes it. `wait_until` is when such a wait's bound passes (milliseconds since
-- the Unix epoch; NULL unless the invocation waits): the orchestrators end those past it.
-- `cancel_reason` is what the caller of a cancel gave, the terminal detail.
--
-- SQLite cannot change a CHECK constraint in place, so the table is rebuilt (SQLite's
-- twelve-step ALTER TABLE procedure), with foreign keys off, which only works outside a
-- transaction: hence `no-transaction` and the explicit one below. The rebuild can run
-- again if the process dies after its COMMIT and before sqlx records it.
PRAGMA foreign_keys = OFF;

BEGIN;

CREATE TABLE invocations_rebuilt (
    invocation_id       TEXT    NOT NULL PRIMARY KEY,
    idempotency_key     TEXT    UNIQUE,
    state               TEXT    NOT NULL CHECK (state IN ('running', 'waiting', 'ended')),
    version             INTEGER NOT NULL CHECK (version >= 0),
    lease_epoch         INTEGER NOT NULL CHECK (lease_epoch >= 0),
    totals              TEXT    NOT NULL,
    end_record          TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    cancel_requested_at INTEGER,
    tenant              TEXT    NOT NULL DEFAULT '',
    wait_until          INTEGER,
    cancel_reason       TEXT
) STRICT;

INSERT INTO invocations_rebuilt (invocation_id, idempotency_key, state, version, lease_epoch,
        totals, end_record, created_at, updated_at, cancel_requested_at, tenant)
    SELECT invocation_id, idempotency_key, state, version, lease_epoch, totals, end_record,
        created_at, updated_at, cancel_requested_at, tenant
    FROM invocations;

DROP TABLE invocations;
ALTER TABLE invocations_rebuilt RENAME TO invocations;

CREATE INDEX invocations_by_state ON invocations (state, invocation_id);
CREATE INDEX invocations_running_by_id ON invocations (invocation_id) WHERE state = 'running';
CREATE INDEX invocations_by_tenant ON invocations (tenant, invocation_id);
CREATE INDEX invocations_by_tenant_and_state ON invocations (tenant, state, invocation_id);
-- `expired_waits()`: the waiting invocations whose bound has passed, soonest first.
CREATE INDEX invocations_waiting ON invocations (wait_until) WHERE state = 'waiting';

COMMIT;

PRAGMA foreign_keys = ON;
