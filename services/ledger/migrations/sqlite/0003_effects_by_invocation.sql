-- ListByInvocation: every entry of one invocation, oldest first, whatever its state. The
-- orchestrator asks once per final answer, so it must not scan the table; the partial
-- effects_unresolved_by_invocation cannot serve it, since it leaves resolved entries out.
CREATE INDEX effects_by_invocation
    ON effects (invocation_id, seq);
