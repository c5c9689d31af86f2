-- SQLite flavour of migrations/postgres/0018_delivery_rounds.sql (read its comments).
ALTER TABLE webhook_deliveries ADD COLUMN round_start INTEGER NOT NULL DEFAULT 0;
