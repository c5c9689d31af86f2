-- A tenant's runs across its threads, newest first (A2A `ListTasks` without a `contextId`): the
-- listing stays index-bounded however many threads the tenant has.
CREATE INDEX runs_tenant_list_idx ON runs (tenant, created_at DESC, run_id DESC);
