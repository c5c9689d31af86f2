-- What a run does. `agent` (every run before this): the model plans the query, executes the items
-- and synthesizes the answer. `flowchart`: the run runs one flowchart with an input (`POST
-- /v1/flowcharts/{name}/runs`, the MCP server's flowchart tools), without planning or synthesis;
-- `flowchart` holds that call, `{name, input}` (null on an agent run). A constant default adds the
-- column without rewriting the table.
ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'agent'
    CHECK (kind IN ('agent', 'flowchart'));
ALTER TABLE runs ADD COLUMN flowchart JSONB;
