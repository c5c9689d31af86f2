-- Flowcharts as tools (DESIGN §6.2), per tenant. Every PUT of a name adds a version (one more
-- than the highest, deleted ones included); DELETE marks every version deleted, and a call the
-- engine pinned to a version still finds it.
CREATE TABLE flowcharts (
    tenant      TEXT        NOT NULL,
    name        TEXT        NOT NULL,
    version     INTEGER     NOT NULL CHECK (version > 0),
    description TEXT        NOT NULL,
    -- The whole definition as PUT (description included), JSON text.
    spec        TEXT        NOT NULL,
    created_at  TEXT        NOT NULL,
    deleted_at  TEXT,
    CONSTRAINT flowcharts_pkey PRIMARY KEY (tenant, name, version)
);
