-- Operators' numbers (see timeouts/stats.py): the admin, `manage.py timeouts_stats`, the metrics.
-- None of them reads a large set row by row: the counts stop at their LIMIT, and past it stats.py
-- reads the planner's estimate of the rows under the LIMIT instead (EXPLAIN, nothing is run).
-- Parameters use Django's %(name)s style; none appears in a comment (psycopg would bind it there).


-- name: count_pending
-- Counts the PENDING tasks, up to `limit`.
SELECT count(*) AS n FROM (
    SELECT 1 FROM timeouts_task WHERE status = :PENDING
    LIMIT %(limit)s
) AS bounded;


-- name: count_overdue
-- Counts the PENDING tasks due by the database clock, up to `limit`.
--
-- PENDING and due by the database clock; action_time is implied by run_at (run_at >= action_time)
-- but lets PostgreSQL skip future partitions.
SELECT count(*) AS n FROM (
    SELECT 1 FROM timeouts_task WHERE status = :PENDING AND run_at <= now() AND action_time <= now()
    LIMIT %(limit)s
) AS bounded;


-- name: count_default_rows
-- Counts the rows of the DEFAULT partition, up to `limit`.
SELECT count(*) AS n FROM (
    SELECT 1 FROM timeouts_task_default
    LIMIT %(limit)s
) AS bounded;


-- name: table_rows
-- Never run: EXPLAINed for the planner's estimate of the table's rows.
SELECT 1 FROM timeouts_task;


-- name: oldest_overdue
-- The oldest PENDING tasks that are overdue.
--
-- One probe of the partial index timeouts_task_due per past partition.
SELECT job_id, biz_type, biz_id, action_time, run_at, attempts, now() - run_at AS age
FROM timeouts_task
WHERE status = :PENDING AND run_at <= now() AND action_time <= now()
ORDER BY run_at
LIMIT 1;


-- name: status_counts
-- Counts every task by status and biz_type.
SELECT status, biz_type, count(*) AS n
FROM timeouts_task
GROUP BY 1, 2;


-- name: sampled_status_counts
-- A sample of the table's pages (`percent` of them), for tables too large to count.
SELECT status, biz_type, count(*) AS n
FROM timeouts_task TABLESAMPLE SYSTEM (%(percent)s)
GROUP BY 1, 2;


-- name: status_counts_of_one
-- Counts the tasks of one small, indexed status by biz_type, up to `limit`.
--
-- The tasks of one small, indexed status (DISPATCHED and RUNNING: timeouts_task_lease; DEAD:
-- timeouts_task_status), up to the limit.
SELECT biz_type, count(*) AS n
FROM (SELECT biz_type FROM timeouts_task WHERE status = %(status)s LIMIT %(limit)s) AS s
GROUP BY 1;


-- name: lateness
-- How many tasks fell due in the last `window`, how many still wait, and their lateness percentiles.
--
-- Tasks due in the last `window` (cancelled ones left out): how many, how many of them still wait
-- for their first attempt, and the lateness percentiles of the first attempts that started.
SELECT count(*) AS due,
       count(*) FILTER (WHERE status IN (:PENDING, :DISPATCHED) AND attempts = 0) AS waiting,
       count(*) FILTER (WHERE attempts = 1 AND started_at IS NOT NULL) AS started,
       percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY late)
           FILTER (WHERE attempts = 1 AND started_at IS NOT NULL) AS percentiles,
       max(late) FILTER (WHERE attempts = 1 AND started_at IS NOT NULL) AS worst
FROM (SELECT status, attempts, started_at, extract(epoch FROM started_at - action_time)::float8 AS late
      FROM timeouts_task
      WHERE action_time > now() - %(window)s AND action_time <= now() AND status <> :CANCELLED) AS recent;


-- name: lateness_points
-- The quantiles of the same lateness, for merging several shards' percentiles.
--
-- The lateness of the same first attempts as `lateness`, for merging several shards' percentiles:
-- how many started, and `points` evenly spaced quantiles of their lateness (the 0th to the 100th
-- percentile). With at most `points` tasks the quantiles are the sorted values themselves.
WITH late AS MATERIALIZED (
    SELECT extract(epoch FROM started_at - action_time)::float8 AS late
    FROM timeouts_task
    WHERE action_time > now() - %(window)s AND action_time <= now() AND status <> :CANCELLED
      AND attempts = 1 AND started_at IS NOT NULL
), counted AS (
    SELECT count(*) AS started, least(count(*), %(points)s) AS k FROM late
)
SELECT counted.started,
       (SELECT percentile_cont(f.fractions) WITHIN GROUP (ORDER BY late) FROM late) AS points
FROM counted,
     LATERAL (SELECT array_agg(i::float8 / greatest(counted.k - 1, 1) ORDER BY i) AS fractions
              FROM generate_series(0, counted.k - 1) AS i) AS f;


-- name: partition_sizes
-- Every partition's size on disk: table, indexes and TOAST.
SELECT c.relname AS name, pg_total_relation_size(c.oid) AS bytes
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'timeouts_task'::regclass;


-- Per biz_type, for the admin's businesses page, `timeouts_stats` and the metrics. Each reads at
-- most its `limit` rows through an index (test_admin_businesses_plans.py EXPLAINs them on a
-- partitioned table); `now` is the database clock read once per page, so the statements agree
-- with each other and PostgreSQL prunes partitions when it plans them.


-- name: waiting_biz_types
-- The biz_types that have PENDING tasks, in order.
--
-- The distinct biz_types of the PENDING tasks, in order, by a loose index scan of
-- timeouts_task_due_by_type (biz_type, run_at) WHERE PENDING: each step is one probe per partition
-- for the next biz_type after the last one found, however many tasks each biz_type has.
WITH RECURSIVE found(biz_type) AS (
    (SELECT biz_type FROM timeouts_task WHERE status = :PENDING ORDER BY biz_type LIMIT 1)
    UNION ALL
    SELECT (SELECT t.biz_type FROM timeouts_task AS t WHERE t.status = :PENDING AND t.biz_type > found.biz_type
            ORDER BY t.biz_type LIMIT 1)
    FROM found
    WHERE found.biz_type IS NOT NULL
)
SELECT biz_type FROM found WHERE biz_type IS NOT NULL LIMIT %(limit)s;


-- name: count_overdue_of_biz_type
-- Counts one biz_type's overdue PENDING tasks, up to `limit`.
--
-- The PENDING tasks of one biz_type due by `now`, up to `limit`: one range of
-- timeouts_task_due_by_type per past partition, in that index's order, so that the LIMIT stops the
-- scans once it has its rows. Run after plan_counts_in_index_order, in its transaction. The
-- biz_type is given only inside the row comparisons that bound the range, never as `biz_type =`:
-- PostgreSQL would then read `ORDER BY biz_type, run_at` as `ORDER BY run_at`, which the run_at
-- index serves too, and take that one for a biz_type it believes frequent among the due tasks,
-- filtering out every other biz_type's due task until it found this one's (beside another's
-- backlog, the whole backlog). No other index has both columns.
SELECT count(*) AS n FROM (
    SELECT 1 FROM timeouts_task
    WHERE status = :PENDING
      AND (biz_type, run_at) >= (%(biz_type)s, '-infinity'::timestamptz)
      AND (biz_type, run_at) <= (%(biz_type)s, %(now)s)
      AND action_time <= %(now)s
    ORDER BY biz_type, run_at
    LIMIT %(limit)s
) AS bounded;


-- name: plan_counts_in_index_order
-- Makes the rest of the transaction count overdue tasks in index order only.
--
-- For the rest of the transaction, the plans that would read every overdue task of a biz_type
-- (or of a partition) to count a few in count_overdue_of_biz_type are not considered: a sort, an
-- incremental one (the partitions merged by biz_type alone, each biz_type's rows then sorted by
-- run_at) and a bitmap scan (of the admin's (biz_type, action_time) index: every task of the
-- biz_type, then sorted). PostgreSQL picks them when its estimates say few rows match, and the
-- count exists for when many do. What is left is the order of the PENDING tasks' (biz_type,
-- run_at) index, which the LIMIT stops.
SELECT set_config('enable_sort', 'off', true), set_config('enable_incremental_sort', 'off', true),
       set_config('enable_bitmapscan', 'off', true);


-- name: overdue_of_biz_type
-- Never run: EXPLAINed for the planner's estimate when there are more than count_overdue_of_biz_type counts.
SELECT 1 FROM timeouts_task
WHERE biz_type = %(biz_type)s AND status = :PENDING AND run_at <= %(now)s AND action_time <= %(now)s;


-- name: running_by_biz_type
-- Counts the RUNNING tasks by biz_type, beside their concurrency limits.
--
-- The RUNNING tasks by biz_type, beside their concurrency limits, from at most `limit` rows of
-- timeouts_task_lease (partial: it holds only DISPATCHED and RUNNING tasks, which MAX_DISPATCHED
-- and the workers keep few).
SELECT biz_type, count(*) FILTER (WHERE status = :RUNNING) AS running, sum(count(*)) OVER ()::bigint AS read
FROM (SELECT biz_type, status FROM timeouts_task WHERE status IN (:DISPATCHED, :RUNNING) LIMIT %(limit)s) AS s
GROUP BY biz_type;


-- name: due_soon_of_biz_type
-- Counts one biz_type's PENDING tasks due within `window`, by bucket of time.
--
-- The PENDING tasks of one biz_type whose run_at falls in (now, now + window] (first attempts and
-- retries), the first `limit` of them in run_at order, counted by bucket of `bucket` seconds;
-- `read` and `last` say how far the scan went. timeouts_task_due_by_type yields them in run_at
-- order in each partition (a merge of one range per partition that may hold them: the past ones,
-- for retries, and those up to now + window), so the LIMIT stops the scan.
SELECT s.bucket, count(*) AS due, sum(count(*)) OVER ()::bigint AS read, max(max(s.run_at)) OVER () AS last
FROM (SELECT run_at, floor(extract(epoch FROM run_at - %(now)s) / %(bucket)s)::int AS bucket
      FROM timeouts_task
      WHERE biz_type = %(biz_type)s AND status = :PENDING AND run_at > %(now)s AND run_at <= %(now)s + %(window)s
        AND action_time <= %(now)s + %(window)s
      ORDER BY run_at
      LIMIT %(limit)s) AS s
GROUP BY s.bucket;


-- name: recent_lateness_of_biz_type
-- One biz_type's lateness over the last `window`, by bucket of time.
--
-- The tasks of one biz_type due in (now - window, now], the latest `limit` of them, by bucket of
-- `bucket` seconds counted back from now: the median and the 99th percentile of the lateness of
-- first attempts, started_at - action_time, or now - action_time for one still waiting to start
-- (late so far: a paused or limited biz_type shows here before its tasks start). Cancelled tasks
-- and retries are read and left out. The biz_type is a constant (one statement per biz_type), so
-- PostgreSQL plans with that biz_type's own frequency: a rare one's rows off
-- timeouts_task_biz_type, a frequent one's off timeouts_task_action_time (a parameter from a join
-- would be planned with an average frequency, and the whole window read for a rare one). Either
-- index yields the rows in time order, so the LIMIT stops the scan; one or two partitions.
SELECT s.bucket, count(*) FILTER (WHERE s.first_attempt) AS tasks,
       percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY s.late) FILTER (WHERE s.first_attempt)
           AS percentiles,
       sum(count(*)) OVER ()::bigint AS read, min(min(s.action_time)) OVER () AS first
FROM (SELECT action_time,
             (attempts = 0 AND status IN (:PENDING, :DISPATCHED)
              OR attempts = 1 AND status NOT IN (:PENDING, :CANCELLED)) AS first_attempt,
             extract(epoch FROM coalesce(started_at, %(now)s) - action_time)::float8 AS late,
             floor(extract(epoch FROM %(now)s - action_time) / %(bucket)s)::int AS bucket
      FROM timeouts_task
      WHERE biz_type = %(biz_type)s AND action_time > %(now)s - %(window)s AND action_time <= %(now)s
      ORDER BY action_time DESC
      LIMIT %(limit)s) AS s
GROUP BY s.bucket;


-- name: stored_limits
-- The limits and pauses stored per biz_type, with this shard's part of them.
--
-- The limits and pauses stored per biz_type (timeouts.limits; one small row each): in force, the
-- override when there is one, else what the handler declares; and this shard's part of them, as
-- its claims read it (sql/migrations/0001_limits.sql).
SELECT l.biz_type, l.declared_rate_limit, l.declared_concurrency, l.overridden, l.paused,
       l.rate_limit_in_force AS rate_limit, l.concurrency_in_force AS concurrency,
       timeouts_rate_part(l.rate_limit_in_force, l.rate_share, %(shard_count)s::integer) AS rate_part,
       timeouts_concurrency_part(l.concurrency_in_force, l.concurrency_share, %(shard_index)s::integer,
                                 %(shard_count)s::integer) AS concurrency_part
FROM timeouts_limits AS l
ORDER BY l.biz_type
LIMIT %(limit)s;
