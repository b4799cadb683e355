-- Invocations that wait for a human, and why a cancel was asked for (the PostgreSQL twin
-- of the SQLite migration).
--
-- `state` may now be 'waiting': the run stopped for an approval or an answer, and a
-- reply resumes it. `wait_until` is when such a wait's bound passes (milliseconds since
-- the Unix epoch; NULL unless the invocation waits): the orchestrators end those past it.
-- `cancel_reason` is what the caller of a cancel gave, the terminal detail.
ALTER TABLE invocations DROP CONSTRAINT invocations_state_check;
ALTER TABLE invocations ADD CONSTRAINT invocations_state_check
    CHECK (state IN ('running', 'waiting', 'ended'));
ALTER TABLE invocations ADD COLUMN wait_until BIGINT;
ALTER TABLE invocations ADD COLUMN cancel_reason TEXT;

-- `expired_waits()`: the waiting invocations whose bound has passed, soonest first.
CREATE INDEX invocations_waiting ON invocations (wait_until) WHERE state = 'waiting';
