-- What the operator added to a tenant's daily budget, SQLite flavour of
-- migrations/postgres/0016_tenant_budget_raises.sql (read its comments).
CREATE TABLE tenant_budget_raises (
    raise_id      TEXT    NOT NULL,
    tenant        TEXT    NOT NULL,
    tokens        INTEGER NOT NULL DEFAULT 0,
    usd           REAL    NOT NULL DEFAULT 0,
    suspension_id TEXT,
    created_at    TEXT    NOT NULL,
    CONSTRAINT tenant_budget_raises_pkey PRIMARY KEY (raise_id)
);

CREATE INDEX tenant_budget_raises_day_idx ON tenant_budget_raises (tenant, created_at);
