-- Flowcharts as tools (DESIGN §6.2), per tenant. Every PUT of a name adds a version (one more
-- than the highest, deleted ones included); DELETE marks every version deleted, and a call the
-- engine pinned to a version still finds it.
CREATE TABLE flowcharts (
    tenant      TEXT        NOT NULL,
    name        TEXT        NOT NULL,
    version     BIGINT      NOT NULL CHECK (version > 0),
    description TEXT        NOT NULL,
    -- The whole definition as PUT (description included).
    spec        JSONB       NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    deleted_at  TIMESTAMPTZ,
    CONSTRAINT flowcharts_pkey PRIMARY KEY (tenant, name, version)
);
