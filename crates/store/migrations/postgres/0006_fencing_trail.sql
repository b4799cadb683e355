-- The fencing trail: which lease epoch committed each event, and when each epoch was
-- claimed, in one order.
--
-- Fencing is what keeps a worker that lost its lease from committing: a commit carries
-- the worker's epoch and is refused once a later epoch has been claimed. These columns let
-- that promise be checked from outside, after the fact (`agentloop chaos` does): every
-- event must carry the epoch of the last claim before it. `position` comes from one
-- sequence for claims and events, taken while the statement holds the invocation's row
-- lock, so for one invocation it is the order in which claims and commits took effect.
-- Rows written before this migration carry epoch 0 and have no claims.
CREATE SEQUENCE log_positions;

ALTER TABLE events ADD COLUMN lease_epoch BIGINT NOT NULL DEFAULT 0 CHECK (lease_epoch >= 0);
ALTER TABLE events ADD COLUMN position BIGINT NOT NULL DEFAULT nextval('log_positions');

CREATE TABLE lease_claims (
    invocation_id UUID   NOT NULL REFERENCES invocations (invocation_id),
    lease_epoch   BIGINT NOT NULL CHECK (lease_epoch >= 1),
    position      BIGINT NOT NULL DEFAULT nextval('log_positions'),
    PRIMARY KEY (invocation_id, lease_epoch)
);
