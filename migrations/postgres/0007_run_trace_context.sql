-- The W3C trace context (JSON: traceparent, tracestate) a run's spans continue, so a run driven
-- later, elsewhere, after a suspension or a crash stays in the trace of the request that made it.
ALTER TABLE runs ADD COLUMN trace_context TEXT;

-- `pes_suspensions_pending` counts these at every scrape.
CREATE INDEX suspensions_pending_idx ON suspensions (created_at) WHERE status = 'pending';
