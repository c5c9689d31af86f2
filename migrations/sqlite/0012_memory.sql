-- Memory (DESIGN §7.4): a store the agent keeps across threads, per tenant, in the shape of
-- LangGraph's store. An item is a JSON object under a namespace (a path of labels) and a key.
--
-- `namespace` is the labels joined by U+001F (no label holds a control character), compared
-- byte by byte (SQLite's BINARY collation): the namespaces under a prefix `p` are `p` itself and
-- the range [p || U+001F, p || U+0020), so a prefix is an index range.
CREATE TABLE memory_items (
    -- The rowid, and the full-text index's.
    id              INTEGER PRIMARY KEY,
    tenant          TEXT    NOT NULL,
    namespace       TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    -- How many labels the namespace has.
    depth           INTEGER NOT NULL CHECK (depth > 0),
    -- The item's value: a JSON object (text).
    value           TEXT    NOT NULL,
    -- The text full-text search reads: the value's field names and its string and number leaves.
    content         TEXT    NOT NULL,
    -- Where the item is, as full-text tokens: one number per (tenant, namespace prefix) pair
    -- (a hash), so a search scoped to a tenant's prefix intersects the full-text index with it
    -- instead of reading every match in the store (the exact prefix is still checked).
    scope           TEXT    NOT NULL,
    -- The embedding of `content` (little-endian f32s) and the model that made it; NULL when
    -- embeddings are off or the provider could not be reached (then `embed_pending`).
    embedding       BLOB,
    embedding_model TEXT,
    -- Written while embeddings are on but not embedded yet: the background pass embeds it.
    embed_pending   INTEGER NOT NULL DEFAULT 0,
    created_at      TEXT    NOT NULL,
    updated_at      TEXT    NOT NULL,
    -- Past it the item is invisible to every read; the sweeper deletes it.
    expires_at      TEXT,
    CONSTRAINT memory_items_key UNIQUE (tenant, namespace, key)
);

-- Full-text search (FTS5, English stemming), kept in step with the items by the triggers below.
CREATE VIRTUAL TABLE memory_fts USING fts5(
    content,
    scope,
    content = 'memory_items',
    content_rowid = 'id',
    tokenize = 'porter unicode61'
);
CREATE TRIGGER memory_items_fts_insert AFTER INSERT ON memory_items BEGIN
    INSERT INTO memory_fts (rowid, content, scope) VALUES (new.id, new.content, new.scope);
END;
CREATE TRIGGER memory_items_fts_delete AFTER DELETE ON memory_items BEGIN
    INSERT INTO memory_fts (memory_fts, rowid, content, scope)
        VALUES ('delete', old.id, old.content, old.scope);
END;
CREATE TRIGGER memory_items_fts_update AFTER UPDATE OF content, scope ON memory_items BEGIN
    INSERT INTO memory_fts (memory_fts, rowid, content, scope)
        VALUES ('delete', old.id, old.content, old.scope);
    INSERT INTO memory_fts (rowid, content, scope) VALUES (new.id, new.content, new.scope);
END;

-- A search without a query (and semantic search's candidates): a tenant's newest items first.
CREATE INDEX memory_items_recent_idx ON memory_items (tenant, updated_at DESC);
-- The sweeper's expired items, and the embedding pass's pending ones.
CREATE INDEX memory_items_expiry_idx ON memory_items (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX memory_items_pending_idx ON memory_items (updated_at) WHERE embed_pending;

-- Items per tenant (rows, expired ones until swept), for PES_TENANT_MAX_STORE_ITEMS: kept in the
-- transaction of every insert and delete.
CREATE TABLE memory_counts (
    tenant TEXT    NOT NULL PRIMARY KEY,
    items  INTEGER NOT NULL CHECK (items >= 0)
);

-- Writes made under an idempotency key (an agent's `memory_put`: `<runId>:<toolCallId>`): a
-- retry of the same call finds its key here and changes nothing. Kept a day.
CREATE TABLE memory_writes (
    tenant          TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    namespace       TEXT NOT NULL,
    key             TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    CONSTRAINT memory_writes_pkey PRIMARY KEY (tenant, idempotency_key)
);
CREATE INDEX memory_writes_created_idx ON memory_writes (created_at);
