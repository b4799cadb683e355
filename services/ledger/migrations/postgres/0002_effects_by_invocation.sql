-- ListByInvocation: every entry of one invocation, oldest first, whatever its state. The
-- orchestrator asks once per final answer, so it must not scan the table; the partial
-- effects_unresolved_by_invocation cannot serve it, since it leaves resolved entries out.
--
-- A plain CREATE INDEX, inside the migration's transaction: it holds off writes while it
-- builds (one row per external write makes that short), but it either exists whole or not
-- at all. CONCURRENTLY cannot run in a transaction, and a failed concurrent build leaves
-- an invalid index behind that a rerun would not rebuild.
CREATE INDEX effects_by_invocation
    ON effects (invocation_id, seq);
