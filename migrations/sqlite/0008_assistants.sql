-- Assistants (DESIGN §7.2): named, versioned agent configurations, per tenant. An assistant row
-- says which version runs (`current_version`) and numbers versions (`last_version`: never reused,
-- even after versions are pruned or the assistant is deleted and created again). A delete marks
-- the row deleted and drops the versions no active run uses; versions are immutable.
CREATE TABLE assistants (
    tenant          TEXT        NOT NULL,
    assistant_id    TEXT        NOT NULL,
    current_version INTEGER     NOT NULL CHECK (current_version > 0),
    last_version    INTEGER     NOT NULL CHECK (last_version >= current_version),
    created_at      TEXT        NOT NULL,
    updated_at      TEXT        NOT NULL,
    deleted_at      TEXT,
    CONSTRAINT assistants_pkey PRIMARY KEY (tenant, assistant_id)
);

-- Listing the tenant's assistants newest first (keyset on created_at, assistant_id), and the
-- per-tenant count against PES_TENANT_MAX_ASSISTANTS.
CREATE INDEX assistants_list_idx ON assistants (tenant, created_at DESC, assistant_id DESC)
    WHERE deleted_at IS NULL;

CREATE TABLE assistant_versions (
    tenant       TEXT        NOT NULL,
    assistant_id TEXT        NOT NULL,
    version      INTEGER     NOT NULL CHECK (version > 0),
    name         TEXT        NOT NULL,
    description  TEXT,
    -- A thread config (the AgentConfig JSON text).
    config       TEXT        NOT NULL,
    -- Config field names threads and runs using this version may not set (a JSON array).
    locked       TEXT        NOT NULL DEFAULT '[]',
    created_at   TEXT        NOT NULL,
    CONSTRAINT assistant_versions_pkey PRIMARY KEY (tenant, assistant_id, version),
    CONSTRAINT assistant_versions_assistant_fkey FOREIGN KEY (tenant, assistant_id)
        REFERENCES assistants (tenant, assistant_id) ON DELETE CASCADE
);

-- The assistant a thread uses (version NULL: its current one when a run is enqueued), and the
-- version a run was enqueued with. No foreign keys: a deleted assistant's runs keep their record.
ALTER TABLE threads ADD COLUMN assistant_id TEXT;
ALTER TABLE threads ADD COLUMN assistant_version INTEGER;
ALTER TABLE runs ADD COLUMN assistant_id TEXT;
ALTER TABLE runs ADD COLUMN assistant_version INTEGER;
