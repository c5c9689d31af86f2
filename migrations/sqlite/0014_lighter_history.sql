-- History at less cost per commit, SQLite flavour of migrations/postgres/0014_lighter_history.sql
-- (read its comments): the end of a commit is marked on its last observation instead of a row
-- of its own in `commits`. (The version tables keep their foreign keys here: SQLite cannot drop
-- one without rebuilding the table, and its checks cost little; the thread's delete removes the
-- versions itself on both stores.)
ALTER TABLE observations ADD COLUMN commit_changed INTEGER;
ALTER TABLE observations ADD COLUMN commit_phase TEXT;
ALTER TABLE observations ADD COLUMN commit_usage TEXT;
UPDATE observations
   SET (commit_changed, commit_phase, commit_usage) =
       (SELECT c.changed, c.phase, c.usage FROM commits c
         WHERE c.tenant = observations.tenant AND c.thread_id = observations.thread_id
           AND c.seq = observations.seq)
 WHERE EXISTS (SELECT 1 FROM commits c
                WHERE c.tenant = observations.tenant AND c.thread_id = observations.thread_id
                  AND c.seq = observations.seq);
DROP TABLE commits;
