-- Worker hand-over and cancel requests (the PostgreSQL twin of the SQLite migration).
--
-- `cancel_requested_at`: when a caller asked to cancel a running invocation. It is durable
-- so that whichever worker runs the invocation next ends it `cancelled`, even when the
-- worker that ran it when the request came is dead or partitioned.
ALTER TABLE invocations ADD COLUMN cancel_requested_at BIGINT;

-- `running()` pages the live invocations by ID for the orphan sweep; partial, so it only
-- holds the (few) live invocations.
CREATE INDEX invocations_running_by_id
    ON invocations (invocation_id)
    WHERE state = 'running';

DROP INDEX invocations_running;
