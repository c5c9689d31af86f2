-- Thread history and forks (DESIGN §7.2), SQLite flavour of migrations/postgres/0013_history.sql
-- (read its comments): the commit log, versions of the state rows, the seqs of messages and
-- suspensions, and ids unique per thread so that a fork keeps them.

CREATE TABLE commits (
    tenant     TEXT    NOT NULL,
    thread_id  TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    run_id     TEXT,
    type       TEXT    NOT NULL,
    phase      TEXT,
    usage      TEXT,
    changed    INTEGER NOT NULL,
    created_at TEXT    NOT NULL,
    CONSTRAINT commits_pkey PRIMARY KEY (tenant, thread_id, seq),
    CONSTRAINT commits_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

CREATE TABLE agent_state_versions (
    tenant          TEXT    NOT NULL,
    thread_id       TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    intent          TEXT,
    title           TEXT,
    plan            TEXT,
    current_step_id TEXT,
    version         INTEGER NOT NULL,
    CONSTRAINT agent_state_versions_pkey PRIMARY KEY (tenant, thread_id, seq),
    CONSTRAINT agent_state_versions_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

-- Every column of todo_items (a migration that adds one there adds it here too), then the seq.
CREATE TABLE todo_item_versions (
    tenant               TEXT    NOT NULL,
    thread_id            TEXT    NOT NULL,
    item_id              TEXT    NOT NULL,
    position             INTEGER NOT NULL,
    description          TEXT    NOT NULL,
    status               TEXT    NOT NULL,
    dependencies         TEXT    NOT NULL DEFAULT '[]',
    step_type            TEXT    NOT NULL,
    required_tools       TEXT    NOT NULL DEFAULT '[]',
    tool_validation_mode TEXT    NOT NULL,
    validation_status    TEXT    NOT NULL,
    expected_outcome     TEXT,
    tool_calls           TEXT    NOT NULL DEFAULT '[]',
    actual_tool_calls    TEXT    NOT NULL DEFAULT '[]',
    tool_results         TEXT    NOT NULL DEFAULT '[]',
    thoughts             TEXT    NOT NULL DEFAULT '[]',
    result               TEXT,
    error                TEXT,
    attempts             INTEGER NOT NULL DEFAULT 0,
    usage                TEXT    NOT NULL,
    conversation         TEXT    NOT NULL DEFAULT '[]',
    run_id               TEXT,
    created_at           TEXT    NOT NULL,
    updated_at           TEXT    NOT NULL,
    started_at           TEXT,
    completed_at         TEXT,
    kind                 TEXT    NOT NULL DEFAULT 'leaf',
    parent_item_id       TEXT,
    role                 TEXT,
    tool_allowlist       TEXT,
    compacted_output     TEXT,
    seq                  INTEGER NOT NULL DEFAULT 0,
    deleted              INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT todo_item_versions_pkey PRIMARY KEY (tenant, thread_id, item_id, seq),
    CONSTRAINT todo_item_versions_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

ALTER TABLE suspensions ADD COLUMN created_seq INTEGER;
ALTER TABLE suspensions ADD COLUMN resolved_seq INTEGER;

-- Messages and observations rebuilt: their ids become unique per thread (SQLite cannot drop a
-- constraint), and messages gain their seq.
CREATE TABLE messages_new (
    id           TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    thread_id    TEXT NOT NULL,
    run_id       TEXT,
    role         TEXT NOT NULL,
    content      TEXT NOT NULL,
    item_id      TEXT,
    tool_call_id TEXT,
    created_at   TEXT NOT NULL,
    name         TEXT,
    tool_calls   TEXT,
    seq          INTEGER,
    CONSTRAINT messages_pkey PRIMARY KEY (tenant, thread_id, id),
    CONSTRAINT messages_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);
INSERT INTO messages_new (id, tenant, thread_id, run_id, role, content, item_id, tool_call_id,
    created_at, name, tool_calls)
  SELECT id, tenant, thread_id, run_id, role, content, item_id, tool_call_id, created_at, name,
    tool_calls FROM messages;
DROP TABLE messages;
ALTER TABLE messages_new RENAME TO messages;
CREATE INDEX messages_order_idx ON messages (tenant, thread_id, created_at, id);
CREATE INDEX messages_conversation_idx ON messages (tenant, thread_id, created_at DESC, id DESC)
    WHERE item_id IS NULL;

CREATE TABLE observations_new (
    tenant     TEXT    NOT NULL,
    thread_id  TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    id         TEXT    NOT NULL,
    run_id     TEXT,
    parent_id  TEXT,
    type       TEXT    NOT NULL,
    title      TEXT    NOT NULL,
    content    TEXT    NOT NULL,
    created_at TEXT    NOT NULL,
    CONSTRAINT observations_pkey PRIMARY KEY (tenant, thread_id, seq),
    CONSTRAINT observations_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);
INSERT INTO observations_new SELECT tenant, thread_id, seq, id, run_id, parent_id, type, title,
    content, created_at FROM observations;
DROP TABLE observations;
ALTER TABLE observations_new RENAME TO observations;
CREATE INDEX observations_parent_idx ON observations (tenant, thread_id, parent_id, seq)
    WHERE parent_id IS NOT NULL;
CREATE INDEX observations_run_idx ON observations (run_id, seq) WHERE run_id IS NOT NULL;

-- What existed before history did: one point per thread, its state at the upgrade.
UPDATE suspensions SET
    created_seq = (SELECT t.last_seq FROM threads t
                   WHERE t.tenant = suspensions.tenant AND t.thread_id = suspensions.thread_id),
    resolved_seq = CASE WHEN status = 'pending' THEN NULL ELSE
                   (SELECT t.last_seq FROM threads t
                    WHERE t.tenant = suspensions.tenant AND t.thread_id = suspensions.thread_id)
                   END;
INSERT INTO commits (tenant, thread_id, seq, run_id, type, changed, created_at)
  SELECT o.tenant, o.thread_id, o.seq, o.run_id, o.type, 1, o.created_at
  FROM threads t JOIN observations o
    ON o.tenant = t.tenant AND o.thread_id = t.thread_id AND o.seq = t.last_seq;
INSERT INTO agent_state_versions
    (tenant, thread_id, seq, intent, title, plan, current_step_id, version)
  SELECT a.tenant, a.thread_id, t.last_seq, a.intent, a.title, a.plan, a.current_step_id, a.version
  FROM agent_state a JOIN threads t ON t.tenant = a.tenant AND t.thread_id = a.thread_id
  WHERE t.last_seq > 0;
INSERT INTO todo_item_versions
  SELECT i.tenant, i.thread_id, i.item_id, i.position, i.description, i.status, i.dependencies,
    i.step_type, i.required_tools, i.tool_validation_mode, i.validation_status,
    i.expected_outcome, i.tool_calls, i.actual_tool_calls, i.tool_results, i.thoughts, i.result,
    i.error, i.attempts, i.usage, i.conversation, i.run_id, i.created_at, i.updated_at,
    i.started_at, i.completed_at, i.kind, i.parent_item_id, i.role, i.tool_allowlist,
    i.compacted_output, t.last_seq, 0
  FROM todo_items i JOIN threads t ON t.tenant = i.tenant AND t.thread_id = i.thread_id;
