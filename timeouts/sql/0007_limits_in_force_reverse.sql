ALTER TABLE timeouts_limits DROP COLUMN IF EXISTS rate_limit_in_force, DROP COLUMN IF EXISTS concurrency_in_force;
