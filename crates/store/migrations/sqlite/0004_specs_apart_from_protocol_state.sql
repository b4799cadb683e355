-- An invocation's spec apart from its protocol state.
--
-- Every commit rewrites its invocation's row (version, lease epoch, totals). With the spec
-- and the request digest in that row (about 1 KB), a group commit of a thousand turns
-- dirtied some 250 pages of invocation rows, more than its events took, and the fsync
-- carried them all. The spec and the digest never change after the start, so they live
-- in a table of their own, and the row a commit rewrites is about 200 bytes.
CREATE TABLE invocation_specs (
    invocation_id  TEXT NOT NULL PRIMARY KEY REFERENCES invocations (invocation_id),
    request_digest TEXT NOT NULL,
    spec           TEXT NOT NULL
) STRICT;

INSERT INTO invocation_specs (invocation_id, request_digest, spec)
    SELECT invocation_id, request_digest, spec FROM invocations;

ALTER TABLE invocations DROP COLUMN spec;
ALTER TABLE invocations DROP COLUMN request_digest;
