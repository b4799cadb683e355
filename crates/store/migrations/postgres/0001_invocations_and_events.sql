-- Invocations and their append-only event logs (the PostgreSQL twin of the SQLite schema).
--
-- IDs are UUIDv7 in a `uuid` column: uuid order is byte order, which is creation order,
-- so listings page by `invocation_id` (a text column would sort by the database's
-- collation instead). Counters and times are BIGINT (u64 values are kept within i64 by
-- the store). Events, totals and the end record are serde JSON of the engine's types,
-- kept as TEXT rather than JSONB: JSONB refuses the escape `\u0000`, which a tool's
-- output may well contain, and reorders keys; the store never queries inside them.

CREATE TABLE invocations (
    invocation_id   UUID    NOT NULL PRIMARY KEY,
    idempotency_key TEXT    UNIQUE,
    request_digest  TEXT    NOT NULL,
    spec            TEXT    NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN ('running', 'ended')),
    version         BIGINT  NOT NULL CHECK (version >= 0),
    lease_epoch     BIGINT  NOT NULL CHECK (lease_epoch >= 0),
    totals          TEXT    NOT NULL,
    end_record      TEXT,
    created_at      BIGINT  NOT NULL,
    updated_at      BIGINT  NOT NULL
);

-- `running()`: the not-ended invocations, oldest first (for resuming and orphan sweeps).
-- Partial, so it only holds the (few) live invocations.
CREATE INDEX invocations_running
    ON invocations (created_at, invocation_id)
    WHERE state = 'running';

-- `list()` with a state filter, newest first (without one, the primary key serves).
CREATE INDEX invocations_by_state
    ON invocations (state, invocation_id);

CREATE TABLE events (
    invocation_id UUID   NOT NULL REFERENCES invocations (invocation_id),
    seq           BIGINT NOT NULL CHECK (seq >= 1),
    committed_at  BIGINT NOT NULL,
    body          TEXT   NOT NULL,
    PRIMARY KEY (invocation_id, seq)
);
