-- Tenants own their invocations (the PostgreSQL twin of the SQLite migration).
--
-- `tenant` is the identity that started the invocation. Listings filter by it, and an
-- idempotency key is unique per tenant: the key column holds `<chars>:<tenant>:<key>`
-- (the tenant's length in characters first, so no tenant name makes one tenant's key
-- another's), and its one unique index does the rest. Rows written before take their
-- tenant from their spec.
ALTER TABLE invocations ADD COLUMN tenant TEXT NOT NULL DEFAULT '';

UPDATE invocations i SET tenant = coalesce(s.spec::jsonb ->> 'tenant', '')
    FROM invocation_specs s
    WHERE s.invocation_id = i.invocation_id;

UPDATE invocations
    SET idempotency_key = length(tenant) || ':' || tenant || ':' || idempotency_key
    WHERE idempotency_key IS NOT NULL;

-- `list()` of one tenant, with and without a state filter, newest first.
CREATE INDEX invocations_by_tenant ON invocations (tenant, invocation_id);
CREATE INDEX invocations_by_tenant_and_state ON invocations (tenant, state, invocation_id);
