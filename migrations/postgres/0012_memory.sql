-- Memory (DESIGN §7.4): a store the agent keeps across threads, per tenant, in the shape of
-- LangGraph's store. An item is a JSON object under a namespace (a path of labels) and a key.
--
-- `namespace` is the labels joined by U+001F (no label holds a control character), in byte
-- order (`COLLATE "C"`): the namespaces under a prefix `p` are `p` itself and the range
-- [p || U+001F, p || U+0020), so a prefix is an index range, and truncating sorted namespaces to a
-- depth keeps them sorted.
CREATE TABLE memory_items (
    tenant          TEXT        NOT NULL,
    namespace       TEXT        COLLATE "C" NOT NULL,
    key             TEXT        COLLATE "C" NOT NULL,
    -- How many labels the namespace has.
    depth           INTEGER     NOT NULL CHECK (depth > 0),
    -- The item's value: a JSON object.
    value           JSONB       NOT NULL,
    -- The text full-text search reads: the value's field names and its string and number leaves.
    content         TEXT        NOT NULL,
    search          tsvector    GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    -- The embedding of `content` (little-endian f32s) and the model that made it; NULL when
    -- embeddings are off or the provider could not be reached (then `embed_pending`).
    embedding       BYTEA,
    embedding_model TEXT,
    -- Written while embeddings are on but not embedded yet: the background pass embeds it.
    embed_pending   BOOLEAN     NOT NULL DEFAULT false,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    -- Past it the item is invisible to every read; the sweeper deletes it.
    expires_at      TIMESTAMPTZ,
    CONSTRAINT memory_items_pkey PRIMARY KEY (tenant, namespace, key)
);

-- Full-text search: the GIN index finds the items that match a query; ranking reads only those.
CREATE INDEX memory_items_search_idx ON memory_items USING GIN (search);
-- A search without a query (and semantic search's candidates): a tenant's newest items first.
CREATE INDEX memory_items_recent_idx ON memory_items (tenant, updated_at DESC);
-- The sweeper's expired items, and the embedding pass's pending ones.
CREATE INDEX memory_items_expiry_idx ON memory_items (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX memory_items_pending_idx ON memory_items (updated_at) WHERE embed_pending;

-- Items per tenant (rows, expired ones until swept), for PES_TENANT_MAX_STORE_ITEMS: kept in the
-- transaction of every insert and delete, so the quota holds across replicas without a count.
CREATE TABLE memory_counts (
    tenant TEXT   NOT NULL,
    items  BIGINT NOT NULL CHECK (items >= 0),
    CONSTRAINT memory_counts_pkey PRIMARY KEY (tenant)
);

-- Writes made under an idempotency key (an agent's `memory_put`: `<runId>:<toolCallId>`): a
-- retry of the same call finds its key here and changes nothing. Kept a day.
CREATE TABLE memory_writes (
    tenant          TEXT        NOT NULL,
    idempotency_key TEXT        NOT NULL,
    namespace       TEXT        NOT NULL,
    key             TEXT        NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL,
    CONSTRAINT memory_writes_pkey PRIMARY KEY (tenant, idempotency_key)
);
CREATE INDEX memory_writes_created_idx ON memory_writes (created_at);
