-- History at less cost per commit (DESIGN §7.2: history may cost W3 at most 5 %).
--
-- 1. The end of a commit is marked on its last observation instead of a row of its own in
--    `commits`: `commit_changed` (not null exactly on a commit's last observation: whether the
--    commit changed the state), `commit_phase` and `commit_usage` (its run's phase and usage
--    after it, what a fork continues from). The observation is written anyway.
-- 2. The version tables lose their foreign keys to `threads`: each insert ran a referential
--    check that locks the thread's row for key share (the same statement updates that row).
--    Nothing is lost: their only writers are the commit paths, gated on the thread's row they
--    update in the same transaction, and both ways a thread is deleted (`DELETE
--    /v1/threads/{id}` and the retention sweeper) delete its versions in that transaction
--    (`store::history::delete_history`).
ALTER TABLE observations ADD COLUMN commit_changed BOOLEAN;
ALTER TABLE observations ADD COLUMN commit_phase TEXT;
ALTER TABLE observations ADD COLUMN commit_usage JSONB;
UPDATE observations o
   SET commit_changed = c.changed, commit_phase = c.phase, commit_usage = c.usage
  FROM commits c
 WHERE c.tenant = o.tenant AND c.thread_id = o.thread_id AND c.seq = o.seq;
DROP TABLE commits;

ALTER TABLE agent_state_versions DROP CONSTRAINT agent_state_versions_thread_fkey;
ALTER TABLE todo_item_versions DROP CONSTRAINT todo_item_versions_thread_fkey;
