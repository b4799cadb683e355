-- The effect ledger on PostgreSQL: one row per effect key. The same columns, names and
-- meanings as the SQLite schema (migrations/sqlite), so both backends run the same
-- statements.
--
-- `seq` orders entries by preparation (oldest first) and is the paging cursor of
-- ListUnresolved; `effect_key` is the identity callers use. States are stored by name so
-- the table is readable with psql during an incident. Times are Unix milliseconds (UTC).
-- Counters and times are BIGINT so they decode as the same 64-bit integers as SQLite's.
--
-- The ledger keeps its migration history in its own table (_agentloop_ledger_migrations),
-- so it can share a database with the event store.
CREATE TABLE effects (
    seq            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    effect_key     TEXT   NOT NULL UNIQUE,
    invocation_id  TEXT   NOT NULL,
    call_id        TEXT   NOT NULL,
    tool           TEXT   NOT NULL,
    state          TEXT   NOT NULL CHECK (state IN
                       ('PREPARED', 'DISPATCHED', 'COMMITTED', 'REJECTED', 'OUTCOME_UNKNOWN',
                        'RECONCILIATION_REQUIRED')),
    attempt        BIGINT NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    receipt        TEXT   NOT NULL DEFAULT '',
    detail         TEXT   NOT NULL DEFAULT '',
    created_at_ms  BIGINT NOT NULL,
    updated_at_ms  BIGINT NOT NULL
);

-- ListUnresolved, with and without an invocation filter.
CREATE INDEX effects_unresolved_by_seq
    ON effects (seq)
    WHERE state IN ('PREPARED', 'DISPATCHED', 'OUTCOME_UNKNOWN', 'RECONCILIATION_REQUIRED');
CREATE INDEX effects_unresolved_by_invocation
    ON effects (invocation_id, seq)
    WHERE state IN ('PREPARED', 'DISPATCHED', 'OUTCOME_UNKNOWN', 'RECONCILIATION_REQUIRED');
