-- Dispatcher queries (see timeouts/dispatcher.py). They run on the dispatcher's LISTEN connection.


-- name: nearest_deadline
-- When the next PENDING task becomes due, beside the database clock and the smallest late policy.
--
-- When the next PENDING task becomes due, and the database clock now, both as Unix epoch seconds
-- (the NOTIFY payloads use the same unit). min() over the partial index timeouts_task_due is one
-- index probe per partition (a MinMaxAgg over a Merge Append of index-only scans), however many
-- tasks wait. Also the dispatcher's keepalive. And the smallest max_lateness of the lateness
-- policies that end late tasks (claims.sql): the dispatcher sweeps the waiting tasks only once the
-- oldest may be that late (dispatch/late_sweep.py), at no query of its own.
SELECT extract(epoch FROM (SELECT min(run_at) FROM timeouts_task WHERE status = :PENDING))::float8 AS deadline,
       extract(epoch FROM clock_timestamp())::float8 AS now,
       {smallest_late_policy} AS min_lateness;


-- name: claimable_deadline
-- When the next PENDING task may be claimed: nearest_deadline, held back by limits and pauses.
--
-- A paused biz_type's tasks not at all, a rate-limited one's not before its bucket is full again,
-- a biz_type at its concurrency limit not before `concurrency_poll` seconds from now (a task that
-- ends wakes nobody). `held` is false when no biz_type is limited or paused: then only the tiny
-- limits table is read, and the deadline is NULL. Read by a dispatcher whose claim left tasks due,
-- so that it sleeps until one may be claimed instead of claiming again and again for nothing. The
-- biz_types with PENDING tasks, and the oldest of each, are stepped through as in claim_due (one
-- probe per partition each); the limits are this shard's parts, and the bucket claim_due's
-- (sql/migrations/0001_limits.sql).
WITH RECURSIVE
held AS MATERIALIZED (
    SELECT l.biz_type, l.paused, l.tokens, l.refilled_at,
           timeouts_rate_part(l.rate_limit_in_force, l.rate_share, %(shard_count)s::integer) AS rate_limit,
           timeouts_concurrency_part(l.concurrency_in_force, l.concurrency_share, %(shard_index)s::integer,
                                     %(shard_count)s::integer) AS concurrency
    FROM timeouts_limits AS l
    WHERE l.paused OR l.rate_limit_in_force IS NOT NULL OR l.concurrency_in_force IS NOT NULL
),
{pending_types},
-- Claimed or running, as claim_due counts them.
in_flight AS (
    SELECT biz_type, count(*) AS n FROM timeouts_task
    WHERE status IN (:DISPATCHED, :RUNNING) AND EXISTS (SELECT FROM held WHERE concurrency IS NOT NULL)
    GROUP BY biz_type
),
claimable AS (
    SELECT CASE
        WHEN h.biz_type IS NULL THEN p.oldest
        WHEN h.paused THEN NULL
        ELSE greatest(
            p.oldest,
            timeouts_bucket_full_at(h.rate_limit, h.tokens, h.refilled_at),
            CASE WHEN coalesce(f.n, 0) >= h.concurrency
                 THEN clock_timestamp() + %(concurrency_poll)s * interval '1 second' END)
        END AS at
    FROM pending_types AS p
    LEFT JOIN held AS h USING (biz_type)
    LEFT JOIN in_flight AS f USING (biz_type)
    WHERE p.biz_type <> '' AND EXISTS (SELECT FROM held)
)
SELECT EXISTS (SELECT FROM held) AS held,
       extract(epoch FROM (SELECT min(at) FROM claimable))::float8 AS deadline,
       extract(epoch FROM clock_timestamp())::float8 AS now;
