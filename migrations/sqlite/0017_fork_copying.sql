-- SQLite flavour of migrations/postgres/0017_fork_copying.sql (read its comments).
ALTER TABLE threads ADD COLUMN copying BOOLEAN NOT NULL DEFAULT FALSE;
