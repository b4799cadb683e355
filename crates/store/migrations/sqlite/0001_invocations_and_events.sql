-- Invocations and their append-only event logs.
--
-- IDs are UUIDv7 in hyphenated text: lexical order is creation order, so listings page
-- by `invocation_id`. Counters and times are INTEGER (u64 values are kept within i64 by
-- the store). Events, totals and the end record are serde JSON of the engine's types.
-- STRICT makes SQLite refuse a value of the wrong type instead of silently storing it.

CREATE TABLE invocations (
    invocation_id   TEXT    NOT NULL PRIMARY KEY,
    idempotency_key TEXT    UNIQUE,
    request_digest  TEXT    NOT NULL,
    spec            TEXT    NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN ('running', 'ended')),
    version         INTEGER NOT NULL CHECK (version >= 0),
    lease_epoch     INTEGER NOT NULL CHECK (lease_epoch >= 0),
    totals          TEXT    NOT NULL,
    end_record      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
) STRICT;

-- `running()`: the not-ended invocations, oldest first, after a restart. Partial, so it
-- only holds the (few) live invocations.
CREATE INDEX invocations_running
    ON invocations (created_at, invocation_id)
    WHERE state = 'running';

-- `list()` with a state filter, newest first (without one, the primary key serves).
CREATE INDEX invocations_by_state
    ON invocations (state, invocation_id);

CREATE TABLE events (
    invocation_id TEXT    NOT NULL REFERENCES invocations (invocation_id),
    seq           INTEGER NOT NULL CHECK (seq >= 1),
    committed_at  INTEGER NOT NULL,
    body          TEXT    NOT NULL,
    PRIMARY KEY (invocation_id, seq)
) STRICT, WITHOUT ROWID;
