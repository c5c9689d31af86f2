-- pes-server schema, Postgres flavour. Timestamps are TIMESTAMPTZ, ids UUID, documents JSONB.
-- Every table below `threads` belongs to one (tenant, thread_id) and goes with it (ON DELETE CASCADE).

CREATE TABLE threads (
    tenant      TEXT        NOT NULL,
    thread_id   TEXT        NOT NULL,
    metadata    JSONB       NOT NULL DEFAULT '{}'::jsonb,
    config      JSONB       NOT NULL DEFAULT '{}'::jsonb,
    created_at  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL,
    -- The per-thread observation counter: the last `seq` handed out. Bumped in the same
    -- transaction that inserts the observations, so a rollback undoes it (gap-free seqs).
    last_seq    BIGINT      NOT NULL DEFAULT 0,
    CONSTRAINT threads_pkey PRIMARY KEY (tenant, thread_id)
);

-- Listing: newest first, keyset pagination on (created_at, thread_id).
CREATE INDEX threads_list_idx ON threads (tenant, created_at DESC, thread_id DESC);

CREATE TABLE agent_state (
    tenant          TEXT   NOT NULL,
    thread_id       TEXT   NOT NULL,
    intent          TEXT,
    title           TEXT,
    plan            TEXT,
    current_step_id TEXT,
    version         BIGINT NOT NULL DEFAULT 0,
    CONSTRAINT agent_state_pkey PRIMARY KEY (tenant, thread_id),
    CONSTRAINT agent_state_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

CREATE TABLE todo_items (
    tenant               TEXT        NOT NULL,
    thread_id            TEXT        NOT NULL,
    item_id              TEXT        NOT NULL,
    position             BIGINT      NOT NULL,
    description          TEXT        NOT NULL,
    status               TEXT        NOT NULL,
    dependencies         JSONB       NOT NULL DEFAULT '[]'::jsonb,
    step_type            TEXT        NOT NULL,
    required_tools       JSONB       NOT NULL DEFAULT '[]'::jsonb,
    tool_validation_mode TEXT        NOT NULL,
    validation_status    TEXT        NOT NULL,
    expected_outcome     TEXT,
    tool_calls           JSONB       NOT NULL DEFAULT '[]'::jsonb,
    actual_tool_calls    JSONB       NOT NULL DEFAULT '[]'::jsonb,
    tool_results         JSONB       NOT NULL DEFAULT '[]'::jsonb,
    thoughts             JSONB       NOT NULL DEFAULT '[]'::jsonb,
    result               TEXT,
    error                JSONB,
    attempts             BIGINT      NOT NULL DEFAULT 0,
    usage                JSONB       NOT NULL,
    conversation         JSONB       NOT NULL DEFAULT '[]'::jsonb,
    run_id               UUID,
    created_at           TIMESTAMPTZ NOT NULL,
    updated_at           TIMESTAMPTZ NOT NULL,
    started_at           TIMESTAMPTZ,
    completed_at         TIMESTAMPTZ,
    CONSTRAINT todo_items_pkey PRIMARY KEY (tenant, thread_id, item_id),
    CONSTRAINT todo_items_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

-- The plan in order.
CREATE INDEX todo_items_position_idx ON todo_items (tenant, thread_id, position, item_id);

CREATE TABLE runs (
    run_id             UUID        NOT NULL,
    tenant             TEXT        NOT NULL,
    thread_id          TEXT        NOT NULL,
    status             TEXT        NOT NULL
        CHECK (status IN ('queued', 'running', 'suspended', 'completed', 'failed', 'cancelled')),
    query              TEXT        NOT NULL,
    config             JSONB       NOT NULL DEFAULT '{}'::jsonb,
    multitask_strategy TEXT        NOT NULL,
    idempotency_key    TEXT,
    created_at         TIMESTAMPTZ NOT NULL,
    started_at         TIMESTAMPTZ,
    ended_at           TIMESTAMPTZ,
    usage              JSONB       NOT NULL,
    error              JSONB,
    final_response     JSONB,
    -- Lease fence: bumped by every claim; every worker write checks it.
    attempt            BIGINT      NOT NULL DEFAULT 0,
    lease_owner        TEXT,
    lease_expires_at   TIMESTAMPTZ,
    phase              TEXT        NOT NULL DEFAULT 'new',
    cancel_requested   BOOLEAN     NOT NULL DEFAULT FALSE,
    start_seq          BIGINT      NOT NULL DEFAULT 0,
    CONSTRAINT runs_pkey PRIMARY KEY (run_id),
    CONSTRAINT runs_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

-- One run per idempotency key and thread.
CREATE UNIQUE INDEX runs_idempotency_key_idx ON runs (tenant, thread_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- Listing newest first, the newest run for the thread status, and the cascade from threads.
CREATE INDEX runs_thread_idx ON runs (tenant, thread_id, created_at DESC, run_id DESC);
-- Active runs of a thread (multitask strategy, thread status, claim eligibility).
CREATE INDEX runs_active_idx ON runs (tenant, thread_id, status, created_at, run_id)
    WHERE status IN ('queued', 'running', 'suspended');
-- Claiming: oldest queued runs first.
CREATE INDEX runs_queued_idx ON runs (created_at, run_id) WHERE status = 'queued';
-- Claiming: running runs whose lease expired.
CREATE INDEX runs_lease_idx ON runs (lease_expires_at) WHERE status = 'running';
-- Belt and braces: never two running runs on one thread, whatever the claim query does.
CREATE UNIQUE INDEX runs_one_running_per_thread_idx ON runs (tenant, thread_id)
    WHERE status = 'running';

CREATE TABLE messages (
    id           UUID        NOT NULL,
    tenant       TEXT        NOT NULL,
    thread_id    TEXT        NOT NULL,
    run_id       UUID,
    role         TEXT        NOT NULL,
    content      TEXT        NOT NULL,
    item_id      TEXT,
    tool_call_id TEXT,
    created_at   TIMESTAMPTZ NOT NULL,
    CONSTRAINT messages_pkey PRIMARY KEY (id),
    CONSTRAINT messages_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

-- History oldest first, keyset pagination on (created_at, id).
CREATE INDEX messages_order_idx ON messages (tenant, thread_id, created_at, id);

CREATE TABLE observations (
    tenant     TEXT        NOT NULL,
    thread_id  TEXT        NOT NULL,
    seq        BIGINT      NOT NULL,
    id         UUID        NOT NULL,
    run_id     UUID,
    parent_id  TEXT,
    type       TEXT        NOT NULL,
    title      TEXT        NOT NULL,
    content    JSONB       NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    -- Also serves `seq > after ORDER BY seq` (replay) and type filters.
    CONSTRAINT observations_pkey PRIMARY KEY (tenant, thread_id, seq),
    CONSTRAINT observations_id_key UNIQUE (id),
    CONSTRAINT observations_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

-- `parentId` filter (a subtree of the stream).
CREATE INDEX observations_parent_idx ON observations (tenant, thread_id, parent_id, seq)
    WHERE parent_id IS NOT NULL;
-- One run's observations.
CREATE INDEX observations_run_idx ON observations (run_id, seq) WHERE run_id IS NOT NULL;

CREATE TABLE suspensions (
    suspension_id        UUID        NOT NULL,
    tenant               TEXT        NOT NULL,
    thread_id            TEXT        NOT NULL,
    run_id               UUID        NOT NULL,
    item_id              TEXT        NOT NULL,
    kind                 TEXT        NOT NULL,
    tool_call            JSONB       NOT NULL,
    allowed_decisions    JSONB       NOT NULL,
    question             TEXT,
    input_schema         JSONB,
    iteration_state      JSONB       NOT NULL,
    partial_tool_results JSONB       NOT NULL DEFAULT '[]'::jsonb,
    status               TEXT        NOT NULL
        CHECK (status IN ('pending', 'resolved', 'expired', 'cancelled')),
    decision             JSONB,
    created_at           TIMESTAMPTZ NOT NULL,
    resolved_at          TIMESTAMPTZ,
    expires_at           TIMESTAMPTZ,
    CONSTRAINT suspensions_pkey PRIMARY KEY (suspension_id),
    CONSTRAINT suspensions_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE,
    CONSTRAINT suspensions_run_fkey FOREIGN KEY (run_id)
        REFERENCES runs (run_id) ON DELETE CASCADE
);

-- Pending (or all) suspensions of a thread, oldest first.
CREATE INDEX suspensions_thread_idx ON suspensions (tenant, thread_id, status, created_at);
-- The pending suspension of a run; the cascade from runs.
CREATE INDEX suspensions_run_idx ON suspensions (run_id, status);
-- Expiry sweeps.
CREATE INDEX suspensions_expiry_idx ON suspensions (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;
