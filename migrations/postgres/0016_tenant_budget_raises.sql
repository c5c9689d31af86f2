-- What the operator added to a tenant's daily budget (`PES_TENANT_BUDGETS`): one row per raise,
-- made by `POST /v1/admin/tenants/{tenant}/budget-raises` or by the operator's approval of a
-- suspension on the tenant's day. A raise counts for the UTC day it was made in: the engine reads
-- the day's raises with the day's spend, so every replica sees them at its next read.
CREATE TABLE tenant_budget_raises (
    raise_id      UUID             NOT NULL,
    tenant        TEXT             NOT NULL,
    -- Tokens added to the day's `maxTokens` (0: none).
    tokens        BIGINT           NOT NULL DEFAULT 0,
    -- US dollars added to the day's `maxCostUsd` (0: none).
    usd           DOUBLE PRECISION NOT NULL DEFAULT 0,
    -- The suspension whose approval made it, if one did.
    suspension_id UUID,
    created_at    TIMESTAMPTZ      NOT NULL,
    CONSTRAINT tenant_budget_raises_pkey PRIMARY KEY (raise_id)
);

-- The raises of one tenant since midnight.
CREATE INDEX tenant_budget_raises_day_idx ON tenant_budget_raises (tenant, created_at);
