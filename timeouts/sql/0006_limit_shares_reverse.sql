ALTER TABLE timeouts_limits DROP CONSTRAINT IF EXISTS timeouts_limits_shares_valid;
ALTER TABLE timeouts_limits DROP COLUMN IF EXISTS rate_share, DROP COLUMN IF EXISTS concurrency_share;
