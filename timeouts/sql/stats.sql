-- Operators' numbers (see timeouts/stats.py): the admin, `manage.py timeouts_stats`, the metrics.
-- None of them reads a large set row by row: the counts stop at their LIMIT, and past it stats.py
-- reads the planner's estimate of the rows under the LIMIT instead (EXPLAIN, nothing is run).
-- Parameters use Django's %(name)s style; none appears in a comment (psycopg would bind it there).


-- name: count_pending
SELECT count(*) AS n FROM (
    SELECT 1 FROM timeouts_task WHERE status = :PENDING
    LIMIT %(limit)s
) AS bounded;


-- name: count_overdue
-- PENDING and due by the database clock; action_time is implied by run_at (run_at >= action_time)
-- but lets PostgreSQL skip future partitions.
SELECT count(*) AS n FROM (
    SELECT 1 FROM timeouts_task WHERE status = :PENDING AND run_at <= now() AND action_time <= now()
    LIMIT %(limit)s
) AS bounded;


-- name: count_default_rows
SELECT count(*) AS n FROM (
    SELECT 1 FROM timeouts_task_default
    LIMIT %(limit)s
) AS bounded;


-- name: table_rows
-- Never run: EXPLAINed for the planner's estimate of the table's rows.
SELECT 1 FROM timeouts_task;


-- name: oldest_overdue
-- One probe of the partial index timeouts_task_due per past partition.
SELECT job_id, biz_type, biz_id, action_time, run_at, attempts, now() - run_at AS age
FROM timeouts_task
WHERE status = :PENDING AND run_at <= now() AND action_time <= now()
ORDER BY run_at
LIMIT 1;


-- name: status_counts
SELECT status, biz_type, count(*) AS n
FROM timeouts_task
GROUP BY 1, 2;


-- name: sampled_status_counts
-- A sample of the table's pages (`percent` of them), for tables too large to count.
SELECT status, biz_type, count(*) AS n
FROM timeouts_task TABLESAMPLE SYSTEM (%(percent)s)
GROUP BY 1, 2;


-- name: status_counts_of_one
-- The tasks of one small, indexed status (DISPATCHED and RUNNING: timeouts_task_lease; DEAD:
-- timeouts_task_status), up to the limit.
SELECT biz_type, count(*) AS n
FROM (SELECT biz_type FROM timeouts_task WHERE status = %(status)s LIMIT %(limit)s) AS s
GROUP BY 1;


-- name: lateness
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


-- name: partition_sizes
-- Every partition's size on disk: table, indexes and TOAST.
SELECT c.relname AS name, pg_total_relation_size(c.oid) AS bytes
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'timeouts_task'::regclass;
