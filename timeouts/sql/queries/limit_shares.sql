-- Limits across shards: setting each shard's part of a biz_type's limits (timeouts/limiting/shares.py;
-- the columns: sql/migrations/0001_limits.sql). Run by the scan, a few statements per shard per
-- scan.


-- name: limit_demand
-- What each limited biz_type needs of its limits on this shard: running and due tasks.
--
-- The biz_types a limit holds back here (paused ones are held whole on every shard), with the limits
-- in force, this shard's parts of them (the concurrency's also in tasks, as its claims read it: the
-- shard's `shard_index`), and what its parts must cover: its tasks claimed or running,
-- and its tasks due within `horizon` seconds, counted up to `cap` along timeouts_task_due_by_type
-- (the biz_type only inside row comparisons, so no other index serves the order: see
-- count_overdue_of_biz_type). Claimed or running tasks are counted for every biz_type at once,
-- from the lease index, as claim_due counts them.
WITH limited AS MATERIALIZED (
    SELECT l.biz_type, l.rate_limit_in_force AS rate_limit, l.concurrency_in_force AS concurrency, l.rate_share,
           l.concurrency_share,
           timeouts_concurrency_part(l.concurrency_in_force, l.concurrency_share, %(shard_index)s::integer,
                                     %(shard_count)s::integer) AS concurrency_part
    FROM timeouts_limits AS l
    WHERE NOT l.paused AND (l.rate_limit_in_force IS NOT NULL OR l.concurrency_in_force IS NOT NULL)
),
in_flight AS (
    SELECT biz_type, count(*) AS n FROM timeouts_task
    WHERE status IN (:DISPATCHED, :RUNNING) AND EXISTS (SELECT FROM limited)
    GROUP BY biz_type
)
SELECT l.biz_type, l.rate_limit, l.concurrency, l.rate_share, l.concurrency_share, l.concurrency_part,
       coalesce(f.n, 0) AS in_flight, d.n AS due
FROM limited AS l
LEFT JOIN in_flight AS f USING (biz_type)
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT FROM timeouts_task AS t
        WHERE t.status = :PENDING
          AND (t.biz_type, t.run_at) >= (l.biz_type, '-infinity'::timestamptz)
          AND (t.biz_type, t.run_at) <= (l.biz_type, now() + %(horizon)s * interval '1 second')
        ORDER BY t.biz_type, t.run_at
        LIMIT %(cap)s
    ) AS capped
) AS d
ORDER BY l.biz_type;


-- name: lock_limits_rows
-- Locks the limits rows of some biz_types, which holds their claims on this shard.
--
-- Holds the claims of these biz_types here (claim_due skips a locked row) while a part is lowered
-- to what this shard then runs, counted after the lock by in_flight_by_biz_type.
SELECT biz_type FROM timeouts_limits WHERE biz_type = ANY(%(biz_types)s::varchar[]) ORDER BY biz_type FOR UPDATE;


-- name: in_flight_by_biz_type
-- Counts the claimed or running tasks by biz_type.
SELECT biz_type, count(*) AS n FROM timeouts_task WHERE status IN (:DISPATCHED, :RUNNING) GROUP BY biz_type;


-- name: set_limit_shares
-- Sets this shard's part of the limits of some biz_types.
--
-- NULL keeps a part as it is.
UPDATE timeouts_limits AS l
SET rate_share = coalesce(s.rate_share, l.rate_share),
    concurrency_share = coalesce(s.concurrency_share, l.concurrency_share)
FROM unnest(%(biz_types)s::varchar[], %(rate_shares)s::float8[], %(concurrency_shares)s::float8[])
         AS s(biz_type, rate_share, concurrency_share)
WHERE l.biz_type = s.biz_type;


-- name: clear_limit_shares
-- Back to even parts, for a new number of shards (timeouts_reshard).
UPDATE timeouts_limits SET rate_share = NULL, concurrency_share = NULL
WHERE rate_share IS NOT NULL OR concurrency_share IS NOT NULL;
