-- pes-server schema, SQLite flavour. Timestamps are TEXT in the fixed-width, sortable UTC format
-- `YYYY-MM-DDTHH:MM:SS.ffffffZ`; ids are hyphenated lowercase UUID text; documents are JSON text.
-- Connection pragmas (foreign_keys, WAL, busy_timeout, synchronous) are set by the store on connect.
-- Every table below `threads` belongs to one (tenant, thread_id) and goes with it (ON DELETE CASCADE).

CREATE TABLE threads (
    tenant      TEXT        NOT NULL,
    thread_id   TEXT        NOT NULL,
    metadata    TEXT        NOT NULL DEFAULT '{}',
    config      TEXT        NOT NULL DEFAULT '{}',
    created_at  TEXT        NOT NULL,
    updated_at  TEXT        NOT NULL,
    -- The per-thread observation counter: the last `seq` handed out. Bumped in the same
    -- transaction that inserts the observations, so a rollback undoes it (gap-free seqs).
    last_seq    INTEGER     NOT NULL DEFAULT 0,
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
    version         INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT agent_state_pkey PRIMARY KEY (tenant, thread_id),
    CONSTRAINT agent_state_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

CREATE TABLE todo_items (
    tenant               TEXT        NOT NULL,
    thread_id            TEXT        NOT NULL,
    item_id              TEXT        NOT NULL,
    position             INTEGER     NOT NULL,
    description          TEXT        NOT NULL,
    status               TEXT        NOT NULL,
    dependencies         TEXT        NOT NULL DEFAULT '[]',
    step_type            TEXT        NOT NULL,
    required_tools       TEXT        NOT NULL DEFAULT '[]',
    tool_validation_mode TEXT        NOT NULL,
    validation_status    TEXT        NOT NULL,
    expected_outcome     TEXT,
    tool_calls           TEXT        NOT NULL DEFAULT '[]',
    actual_tool_calls    TEXT        NOT NULL DEFAULT '[]',
    tool_results         TEXT        NOT NULL DEFAULT '[]',
    thoughts             TEXT        NOT NULL DEFAULT '[]',
    result               TEXT,
    error                TEXT,
    attempts             INTEGER     NOT NULL DEFAULT 0,
    usage                TEXT        NOT NULL,
    conversation         TEXT        NOT NULL DEFAULT '[]',
    run_id               TEXT,
    created_at           TEXT        NOT NULL,
    updated_at           TEXT        NOT NULL,
    started_at           TEXT,
    completed_at         TEXT,
    CONSTRAINT todo_items_pkey PRIMARY KEY (tenant, thread_id, item_id),
    CONSTRAINT todo_items_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

-- The plan in order.
CREATE INDEX todo_items_position_idx ON todo_items (tenant, thread_id, position, item_id);

CREATE TABLE runs (
    run_id             TEXT        NOT NULL,
    tenant             TEXT        NOT NULL,
    thread_id          TEXT        NOT NULL,
    status             TEXT        NOT NULL
        CHECK (status IN ('queued', 'running', 'suspended', 'completed', 'failed', 'cancelled')),
    query              TEXT        NOT NULL,
    config             TEXT        NOT NULL DEFAULT '{}',
    multitask_strategy TEXT        NOT NULL,
    idempotency_key    TEXT,
    created_at         TEXT        NOT NULL,
    started_at         TEXT,
    ended_at           TEXT,
    usage              TEXT        NOT NULL,
    error              TEXT,
    final_response     TEXT,
    -- Lease fence: bumped by every claim; every worker write checks it.
    attempt            INTEGER     NOT NULL DEFAULT 0,
    lease_owner        TEXT,
    lease_expires_at   TEXT,
    phase              TEXT        NOT NULL DEFAULT 'new',
    cancel_requested   INTEGER     NOT NULL DEFAULT 0,
    start_seq          INTEGER     NOT NULL DEFAULT 0,
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
    id           TEXT        NOT NULL,
    tenant       TEXT        NOT NULL,
    thread_id    TEXT        NOT NULL,
    run_id       TEXT,
    role         TEXT        NOT NULL,
    content      TEXT        NOT NULL,
    item_id      TEXT,
    tool_call_id TEXT,
    created_at   TEXT        NOT NULL,
    CONSTRAINT messages_pkey PRIMARY KEY (id),
    CONSTRAINT messages_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

-- History oldest first, keyset pagination on (created_at, id).
CREATE INDEX messages_order_idx ON messages (tenant, thread_id, created_at, id);

CREATE TABLE observations (
    tenant     TEXT        NOT NULL,
    thread_id  TEXT        NOT NULL,
    seq        INTEGER     NOT NULL,
    id         TEXT        NOT NULL,
    run_id     TEXT,
    parent_id  TEXT,
    type       TEXT        NOT NULL,
    title      TEXT        NOT NULL,
    content    TEXT        NOT NULL,
    created_at TEXT        NOT NULL,
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
    suspension_id        TEXT        NOT NULL,
    tenant               TEXT        NOT NULL,
    thread_id            TEXT        NOT NULL,
    run_id               TEXT        NOT NULL,
    item_id              TEXT        NOT NULL,
    kind                 TEXT        NOT NULL,
    tool_call            TEXT        NOT NULL,
    allowed_decisions    TEXT        NOT NULL,
    question             TEXT,
    input_schema         TEXT,
    iteration_state      TEXT        NOT NULL,
    partial_tool_results TEXT        NOT NULL DEFAULT '[]',
    status               TEXT        NOT NULL
        CHECK (status IN ('pending', 'resolved', 'expired', 'cancelled')),
    decision             TEXT,
    created_at           TEXT        NOT NULL,
    resolved_at          TEXT,
    expires_at           TEXT,
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
