-- Limits across shards: each shard's part of a biz_type's deployment-wide limits.
--
-- With several shards (TIMEOUTS["SHARDS"]) every shard claims from its own table, so a limit held
-- whole on each would let N times the limit through. Each shard's row says instead what part of
-- the limit in force its claims may use, as a fraction of it: the rest belongs to the other shards.
-- timeouts/limit_shares.py sets the parts after demand, so that they add up to at most the whole;
-- NULL (a new row, or one shard) means an even part: 1/N of the rate, and an even integer split of
-- the concurrency. Fractions rather than numbers of tasks: a new limit (set_limits(), a deploy)
-- is then shared as the old one was, on each shard as soon as it is written there.
-- Nullable and without a default: adding them rewrites nothing.
ALTER TABLE timeouts_limits
    ADD COLUMN IF NOT EXISTS rate_share double precision,
    ADD COLUMN IF NOT EXISTS concurrency_share double precision;

ALTER TABLE timeouts_limits DROP CONSTRAINT IF EXISTS timeouts_limits_shares_valid;
-- A rate share is never 0: the claim's token bucket refills at the shared rate, and the dispatcher
-- divides by it. A concurrency share may be 0: none of the biz_type's tasks may start here now.
ALTER TABLE timeouts_limits ADD CONSTRAINT timeouts_limits_shares_valid CHECK (
    (rate_share > 0 AND rate_share <= 1) IS NOT FALSE
    AND (concurrency_share >= 0 AND concurrency_share <= 1) IS NOT FALSE);
