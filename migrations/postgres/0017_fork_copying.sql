-- A fork is copied in batches, each its own short transaction, so a fork of a long thread never
-- holds other writers back for long. Until its last batch commits, the fork's thread row is
-- `copying`: no read, list, run or cron sees it, and the retention sweeper deletes one whose copy
-- stopped (its process died) once it has not moved for a while.
ALTER TABLE threads ADD COLUMN copying BOOLEAN NOT NULL DEFAULT FALSE;
