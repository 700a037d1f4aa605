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

-- A shard's part of a biz_type's limits, as the claims read them (claim_due, claimable_deadline):
-- the whole limit on the only shard; else the part the scan stored, or an even part until it has:
-- 1/N of the rate, and the concurrency split into N integers that add up to it. NULL limit, NULL
-- part. Plain SQL and IMMUTABLE, so the planner inlines them: the claim's plan is unchanged.
CREATE OR REPLACE FUNCTION timeouts_rate_part(rate_limit double precision, share double precision,
                                              shard_count integer)
RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT rate_limit * CASE WHEN shard_count = 1 THEN 1 ELSE coalesce(share, 1.0 / shard_count) END
$$;

CREATE OR REPLACE FUNCTION timeouts_concurrency_part(concurrency integer, share double precision,
                                                     shard_index integer, shard_count integer)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN shard_count = 1 THEN concurrency
                -- stored as a fraction of the limit: exact for the limit it was shared from
                WHEN share IS NOT NULL THEN floor(concurrency * share + 1e-9)::integer
                ELSE concurrency * (shard_index + 1) / shard_count - concurrency * shard_index / shard_count
           END
$$;
