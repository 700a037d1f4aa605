DROP FUNCTION IF EXISTS timeouts_concurrency_part(integer, double precision, integer, integer);
DROP FUNCTION IF EXISTS timeouts_rate_part(double precision, double precision, integer);
ALTER TABLE timeouts_limits DROP CONSTRAINT IF EXISTS timeouts_limits_shares_valid;
ALTER TABLE timeouts_limits DROP COLUMN IF EXISTS rate_share, DROP COLUMN IF EXISTS concurrency_share;
