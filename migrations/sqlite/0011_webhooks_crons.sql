-- Webhooks and crons (DESIGN §7.3).
--
-- A run keeps the webhook it was enqueued with (its own, else its thread's, else its assistant
-- version's, resolved once at enqueue) and the cron that made it, if any.
ALTER TABLE runs ADD COLUMN webhook TEXT;
ALTER TABLE runs ADD COLUMN cron_id TEXT;

-- The outbox: one row per webhook to send, inserted by the very statement (or transaction) that
-- ends or suspends the run, so a run that ended always has its delivery and a run that did not
-- never has one, whatever crashes. `run_snapshot` is the run row as that commit left it (the
-- body's `data`), so a later change of the run (a resume) does not change what is sent.
-- A replica claims a due row by moving `next_attempt_at` to the end of its lease and counting
-- the attempt; its outcome is written fenced by `lease_owner` and `attempts`.
CREATE TABLE webhook_deliveries (
    delivery_id      TEXT        NOT NULL,
    tenant           TEXT        NOT NULL,
    thread_id        TEXT        NOT NULL,
    run_id           TEXT        NOT NULL,
    event            TEXT        NOT NULL
        CHECK (event IN ('run.completed', 'run.failed', 'run.cancelled', 'run.suspended')),
    url              TEXT        NOT NULL,
    run_snapshot     TEXT        NOT NULL,
    -- The pending suspension a `run.suspended` event is about.
    suspension_id    TEXT,
    status           TEXT        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts         INTEGER     NOT NULL DEFAULT 0,
    next_attempt_at  TEXT        NOT NULL,
    lease_owner      TEXT,
    -- The exact body sent, frozen at the first attempt so every retry sends the same bytes.
    body             TEXT,
    last_error       TEXT,
    last_status_code INTEGER,
    created_at       TEXT        NOT NULL,
    last_attempt_at  TEXT,
    delivered_at     TEXT,
    CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (delivery_id)
);

-- What is due: the delivery loop's claim.
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at)
    WHERE status = 'pending';
-- `GET /v1/webhook-deliveries`, newest first, per tenant (and per run).
CREATE INDEX webhook_deliveries_list_idx
    ON webhook_deliveries (tenant, created_at DESC, delivery_id DESC);
CREATE INDEX webhook_deliveries_run_idx ON webhook_deliveries (tenant, run_id);

-- Crons: a schedule that posts a query. `next_run_at` is the next tick to run; a replica claims
-- a due cron with a lease (`lease_owner`, `lease_expires_at`), enqueues the tick's run (its
-- idempotency key names the tick, so a tick re-run after a crash is the same run), then advances
-- `next_run_at` fenced by its lease and the tick it ran.
CREATE TABLE crons (
    cron_id            TEXT        NOT NULL,
    tenant             TEXT        NOT NULL,
    thread_id          TEXT,
    assistant_id       TEXT,
    schedule           TEXT        NOT NULL,
    timezone           TEXT        NOT NULL,
    query              TEXT        NOT NULL,
    config             TEXT        NOT NULL DEFAULT '{}',
    multitask_strategy TEXT,
    enabled            INTEGER     NOT NULL,
    on_missed          TEXT        NOT NULL CHECK (on_missed IN ('run_once', 'skip')),
    next_run_at        TEXT        NOT NULL,
    lease_owner        TEXT,
    lease_expires_at   TEXT,
    last_tick_at       TEXT,
    last_run_id        TEXT,
    last_thread_id     TEXT,
    last_error         TEXT,
    created_at         TEXT        NOT NULL,
    updated_at         TEXT        NOT NULL,
    CONSTRAINT crons_pkey PRIMARY KEY (cron_id),
    -- A cron on a thread goes with it.
    CONSTRAINT crons_thread_fkey FOREIGN KEY (tenant, thread_id)
        REFERENCES threads (tenant, thread_id) ON DELETE CASCADE
);

-- The scheduler's claim: enabled crons by their next tick.
CREATE INDEX crons_due_idx ON crons (next_run_at) WHERE enabled = TRUE;
-- `GET /v1/crons`, newest first, per tenant; the tenant's count against PES_TENANT_MAX_CRONS.
CREATE INDEX crons_list_idx ON crons (tenant, created_at DESC, cron_id DESC);
CREATE INDEX crons_thread_idx ON crons (tenant, thread_id) WHERE thread_id IS NOT NULL;
