-- Dispatcher queries (see timeouts/dispatcher.py). They run on the dispatcher's LISTEN connection.


-- name: nearest_deadline
-- When the next PENDING task becomes due, and the database clock now, both as Unix epoch seconds
-- (the NOTIFY payloads use the same unit). min() over the partial index timeouts_task_due is one
-- index probe per partition (a MinMaxAgg over a Merge Append of index-only scans), however many
-- tasks wait. Also the dispatcher's keepalive.
SELECT extract(epoch FROM (SELECT min(run_at) FROM timeouts_task WHERE status = :PENDING))::float8 AS deadline,
       extract(epoch FROM clock_timestamp())::float8 AS now;


-- name: claimable_deadline
-- When the next PENDING task may be claimed, as nearest_deadline, but held back by the limits
-- and pauses of timeouts_limits: a paused biz_type's tasks not at all, a rate-limited one's not
-- before its bucket is full again, a biz_type at its concurrency limit not before
-- `concurrency_poll` seconds from now (a task that ends wakes nobody). `held` is false when no
-- biz_type is limited or paused: then only the tiny limits table is read, and the deadline is NULL.
-- Read by a dispatcher whose claim left tasks due, so that it sleeps until one may be claimed
-- instead of claiming again and again for nothing. The biz_types with PENDING tasks, and the
-- oldest of each, are stepped through as in claim_due (one probe per partition each).
WITH RECURSIVE
held AS MATERIALIZED (
    SELECT l.biz_type, l.paused, l.tokens, l.refilled_at,
           -- this shard's part of them, bounded as claim_due reads it: the wait for a full bucket
           -- below is then at most a few thousand years, in range whatever the row holds
           timeouts_rate_part(CASE WHEN l.rate_limit_in_force < 1.0 / 86400 THEN 1.0 / 86400
                                   WHEN l.rate_limit_in_force > 1e6 THEN 1e6 ELSE l.rate_limit_in_force END,
                              CASE WHEN l.rate_share < 1e-6 THEN 1e-6 ELSE l.rate_share END,
                              %(shard_count)s::integer) AS rate_limit,
           timeouts_concurrency_part(CASE WHEN l.concurrency_in_force > 1000000 THEN 1000000
                                          ELSE l.concurrency_in_force END,
                                     l.concurrency_share, %(shard_index)s::integer, %(shard_count)s::integer)
               AS concurrency
    FROM timeouts_limits AS l
    WHERE l.paused OR l.rate_limit_in_force IS NOT NULL OR l.concurrency_in_force IS NOT NULL
),
pending_types AS (
    SELECT ''::varchar AS biz_type, NULL::timestamptz AS run_at
    WHERE EXISTS (SELECT FROM held)
    UNION ALL
    SELECT next.biz_type, next.run_at
    FROM pending_types AS p
    CROSS JOIN LATERAL (
        SELECT t.biz_type, t.run_at FROM timeouts_task AS t
        WHERE t.status = :PENDING AND t.biz_type > p.biz_type
        ORDER BY t.biz_type, t.run_at LIMIT 1
    ) AS next
),
-- Claimed or running, as claim_due counts them.
in_flight AS (
    SELECT biz_type, count(*) AS n FROM timeouts_task
    WHERE status IN (:DISPATCHED, :RUNNING) AND EXISTS (SELECT FROM held WHERE concurrency IS NOT NULL)
    GROUP BY biz_type
),
deadlines AS (
    SELECT p.biz_type, h.biz_type IS NOT NULL AS limited, h.paused, h.tokens, h.refilled_at, h.rate_limit,
           greatest(h.rate_limit / 20, 1) AS burst,  -- claim_due's bucket size
           h.concurrency, coalesce(f.n, 0) AS in_flight, p.run_at
    FROM pending_types AS p
    LEFT JOIN held AS h USING (biz_type)
    LEFT JOIN in_flight AS f USING (biz_type)
    WHERE p.biz_type <> ''
),
claimable AS (
    SELECT CASE
        WHEN NOT d.limited THEN d.run_at
        WHEN d.paused THEN NULL
        ELSE greatest(
            d.run_at,
            -- when its bucket is full again, so that its claims come at most twenty a second
            CASE WHEN d.rate_limit IS NOT NULL AND d.refilled_at IS NOT NULL AND d.tokens < d.burst
                 THEN d.refilled_at + (d.burst - d.tokens) / d.rate_limit * interval '1 second' END,
            CASE WHEN d.in_flight >= d.concurrency
                 THEN clock_timestamp() + %(concurrency_poll)s * interval '1 second' END)
        END AS at
    FROM deadlines AS d
)
SELECT EXISTS (SELECT FROM held) AS held,
       extract(epoch FROM (SELECT min(at) FROM claimable))::float8 AS deadline,
       extract(epoch FROM clock_timestamp())::float8 AS now;
