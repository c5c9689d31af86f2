-- The plan is a graph (DESIGN §6.1): team items with nested children, roles, per-item tool
-- allowlists, and the compacted hand-off of an item's result to the items that read it.
ALTER TABLE todo_items ADD COLUMN kind TEXT NOT NULL DEFAULT 'leaf' CHECK (kind IN ('leaf', 'team'));
ALTER TABLE todo_items ADD COLUMN parent_item_id TEXT;
ALTER TABLE todo_items ADD COLUMN role TEXT;
-- NULL = every enabled tool (JSON text otherwise).
ALTER TABLE todo_items ADD COLUMN tool_allowlist TEXT;
ALTER TABLE todo_items ADD COLUMN compacted_output TEXT;
