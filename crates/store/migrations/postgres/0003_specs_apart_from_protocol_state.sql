-- An invocation's spec apart from its protocol state (the PostgreSQL twin of the SQLite
-- migration).
--
-- Every commit updates its invocation's row (version, lease epoch, totals), and an update
-- writes a whole new version of the row. With the spec and the request digest in it
-- (about 1 KB), one such update of 1,000 running invocations wrote 2.8 KB of WAL per row
-- right after a checkpoint and 1.5 KB in the next round; with them apart, 0.8 and 0.5 KB.
-- The spec and the digest never change after the start, so they live in a table of their
-- own.
CREATE TABLE invocation_specs (
    invocation_id  UUID NOT NULL PRIMARY KEY REFERENCES invocations (invocation_id),
    request_digest TEXT NOT NULL,
    spec           TEXT NOT NULL
);

INSERT INTO invocation_specs (invocation_id, request_digest, spec)
    SELECT invocation_id, request_digest, spec FROM invocations;

-- Dropping a column rewrites nothing: rows written before keep the bytes until their next
-- update, which writes them without.
ALTER TABLE invocations DROP COLUMN spec;
ALTER TABLE invocations DROP COLUMN request_digest;
