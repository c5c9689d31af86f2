-- Thread history and forks (DESIGN §7.2). Every commit that reserves seqs writes one `commits`
-- row; every write of a state row also writes a version of it, keyed by the seq of its commit's
-- last observation. The state right after observation N is then the newest version of each row
-- at or before the commit that holds N: a few index probes, whatever the thread's length.

-- One row per commit: its last seq, the run that made it and that run's phase and usage after it
-- (what a fork continues from), and whether it changed §2's state (what `/history` lists).
CREATE TABLE commits (
    tenant     TEXT        NOT NULL,
    thread_id  TEXT        NOT NULL,
    seq        BIGINT      NOT NULL,
    run_id     UUID,
    type       TEXT        NOT NULL,
    phase      TEXT,
    usage      JSONB,
    changed    BOOLEAN     NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    CONSTRAINT commits_pkey PRIMARY KEY (tenant, thread_id, seq),
    CONSTRAINT commits_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

-- The agent state row after each commit that set it.
CREATE TABLE agent_state_versions (
    tenant          TEXT   NOT NULL,
    thread_id       TEXT   NOT NULL,
    seq             BIGINT NOT NULL,
    intent          TEXT,
    title           TEXT,
    plan            TEXT,
    current_step_id TEXT,
    version         BIGINT NOT NULL,
    CONSTRAINT agent_state_versions_pkey PRIMARY KEY (tenant, thread_id, seq),
    CONSTRAINT agent_state_versions_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

-- Each todo item after each commit that wrote it; `deleted` marks the commit that removed it.
CREATE TABLE todo_item_versions (LIKE todo_items INCLUDING DEFAULTS);
ALTER TABLE todo_item_versions ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE todo_item_versions ADD COLUMN deleted BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE todo_item_versions ADD CONSTRAINT todo_item_versions_pkey
    PRIMARY KEY (tenant, thread_id, item_id, seq);
ALTER TABLE todo_item_versions ADD CONSTRAINT todo_item_versions_thread_fkey
    FOREIGN KEY (tenant, thread_id) REFERENCES threads (tenant, thread_id) ON DELETE CASCADE;

-- Which commit wrote a message, and which made and which ended a suspension: a past state and a
-- fork take the ones at or before their seq.
ALTER TABLE messages ADD COLUMN seq BIGINT;
ALTER TABLE suspensions ADD COLUMN created_seq BIGINT;
ALTER TABLE suspensions ADD COLUMN resolved_seq BIGINT;

-- A fork's log is a prefix of its source's, ids and all, and its messages keep theirs: both are
-- unique per thread, not across threads.
ALTER TABLE observations DROP CONSTRAINT observations_id_key;
ALTER TABLE messages DROP CONSTRAINT messages_pkey;
ALTER TABLE messages ADD CONSTRAINT messages_pkey PRIMARY KEY (tenant, thread_id, id);

-- What existed before history did: one point per thread, its state at the upgrade.
UPDATE suspensions s SET created_seq = t.last_seq,
    resolved_seq = CASE WHEN s.status = 'pending' THEN NULL ELSE t.last_seq END
  FROM threads t WHERE t.tenant = s.tenant AND t.thread_id = s.thread_id;
INSERT INTO commits (tenant, thread_id, seq, run_id, type, changed, created_at)
  SELECT o.tenant, o.thread_id, o.seq, o.run_id, o.type, TRUE, o.created_at
  FROM threads t JOIN observations o
    ON o.tenant = t.tenant AND o.thread_id = t.thread_id AND o.seq = t.last_seq;
INSERT INTO agent_state_versions
    (tenant, thread_id, seq, intent, title, plan, current_step_id, version)
  SELECT a.tenant, a.thread_id, t.last_seq, a.intent, a.title, a.plan, a.current_step_id, a.version
  FROM agent_state a JOIN threads t ON t.tenant = a.tenant AND t.thread_id = a.thread_id
  WHERE t.last_seq > 0;
INSERT INTO todo_item_versions
  SELECT i.*, t.last_seq, FALSE
  FROM todo_items i JOIN threads t ON t.tenant = i.tenant AND t.thread_id = i.thread_id;
