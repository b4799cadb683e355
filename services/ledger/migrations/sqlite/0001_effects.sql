-- The effect ledger: one row per effect key.
--
-- `seq` orders entries by preparation (oldest first) and is the paging cursor of
-- ListUnresolved; `effect_key` is the identity callers use. States are stored by name
-- (PREPARED, DISPATCHED, COMMITTED, REJECTED, OUTCOME_UNKNOWN) so the file is readable
-- with the sqlite3 shell during an incident. Times are Unix milliseconds (UTC).
CREATE TABLE effects (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    effect_key     TEXT    NOT NULL UNIQUE,
    invocation_id  TEXT    NOT NULL,
    call_id        TEXT    NOT NULL,
    tool           TEXT    NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN
                       ('PREPARED', 'DISPATCHED', 'COMMITTED', 'REJECTED', 'OUTCOME_UNKNOWN')),
    attempt        INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    receipt        TEXT    NOT NULL DEFAULT '',
    detail         TEXT    NOT NULL DEFAULT '',
    created_at_ms  INTEGER NOT NULL,
    updated_at_ms  INTEGER NOT NULL
);

-- ListUnresolved, with and without an invocation filter.
CREATE INDEX effects_unresolved_by_seq
    ON effects (seq)
    WHERE state IN ('PREPARED', 'DISPATCHED', 'OUTCOME_UNKNOWN');
CREATE INDEX effects_unresolved_by_invocation
    ON effects (invocation_id, seq)
    WHERE state IN ('PREPARED', 'DISPATCHED', 'OUTCOME_UNKNOWN');
