-- A webhook delivery counts every attempt over its life (`attempts`), a manual retry included;
-- `round_start` is how many were made before the current round (a manual retry starts a round),
-- so each round still gets `PES_WEBHOOK_MAX_ATTEMPTS` attempts and its own backoff.
ALTER TABLE webhook_deliveries ADD COLUMN round_start BIGINT NOT NULL DEFAULT 0;
