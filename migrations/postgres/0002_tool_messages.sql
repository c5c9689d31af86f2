-- Tool use in the conversation history: an assistant message lists the tool calls it made
-- (`tool_calls`), and each tool message names the tool that answered (`name`). Both are NULL on
-- the messages that have none.
ALTER TABLE messages ADD COLUMN name TEXT;
ALTER TABLE messages ADD COLUMN tool_calls JSONB;

-- The planner's context: the thread-level conversation (user queries and final answers, which
-- belong to no item), newest first, without scanning the items' tool messages.
CREATE INDEX messages_conversation_idx ON messages (tenant, thread_id, created_at DESC, id DESC)
    WHERE item_id IS NULL;
