-- RECONCILIATION_REQUIRED: an effect whose reconciliation could not tell whether the
-- change was applied, waiting for an operator. SQLite cannot change a CHECK constraint
-- in place, so the table is rebuilt with the same columns in the same order (rows keep
-- their seq, so page tokens stay valid; the AUTOINCREMENT counter follows the rename).
-- sqlx runs the file in one transaction: a failure leaves the old table as it was.
CREATE TABLE effects_v2 (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    effect_key     TEXT    NOT NULL UNIQUE,
    invocation_id  TEXT    NOT NULL,
    call_id        TEXT    NOT NULL,
    tool           TEXT    NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN
                       ('PREPARED', 'DISPATCHED', 'COMMITTED', 'REJECTED', 'OUTCOME_UNKNOWN',
                        'RECONCILIATION_REQUIRED')),
    attempt        INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    receipt        TEXT    NOT NULL DEFAULT '',
    detail         TEXT    NOT NULL DEFAULT '',
    created_at_ms  INTEGER NOT NULL,
    updated_at_ms  INTEGER NOT NULL
);

INSERT INTO effects_v2
    (seq, effect_key, invocation_id, call_id, tool, state, attempt, receipt, detail,
     created_at_ms, updated_at_ms)
SELECT seq, effect_key, invocation_id, call_id, tool, state, attempt, receipt, detail,
       created_at_ms, updated_at_ms
FROM effects;

DROP TABLE effects;
ALTER TABLE effects_v2 RENAME TO effects;

-- ListUnresolved, with and without an invocation filter (dropped with the old table).
CREATE INDEX effects_unresolved_by_seq
    ON effects (seq)
    WHERE state IN ('PREPARED', 'DISPATCHED', 'OUTCOME_UNKNOWN', 'RECONCILIATION_REQUIRED');
CREATE INDEX effects_unresolved_by_invocation
    ON effects (invocation_id, seq)
    WHERE state IN ('PREPARED', 'DISPATCHED', 'OUTCOME_UNKNOWN', 'RECONCILIATION_REQUIRED');
