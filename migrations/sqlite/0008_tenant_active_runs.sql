-- Per-tenant limits and fair claims.
-- The quota on queued and running runs (`PES_TENANT_MAX_ACTIVE_RUNS`) counts these at every
-- enqueue, and the claim counts a tenant's running runs: a small partial index, so neither reads
-- the tenant's finished runs.
CREATE INDEX runs_tenant_active_idx ON runs (tenant) WHERE status IN ('queued', 'running');
-- The claim serves first the tenant whose last run started longest ago: `max(started_at)` per
-- tenant is one look-up here.
CREATE INDEX runs_tenant_started_idx ON runs (tenant, started_at);
