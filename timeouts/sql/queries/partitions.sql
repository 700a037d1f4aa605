-- Partition maintenance queries (see timeouts/storage/partitions.py and partition_ddl.py).
-- Parameters use Django's %(name)s style. DDL naming a partition is composed in Python with
-- psycopg.sql.Identifier (storage/partition_ddl.py); a query here that names one writes {partition},
-- which the loader fills in with one of timeouts' own partition names (store/queries.py).


-- name: list_partitions
-- Every partition of timeouts_task with its bounds.
--
-- Every partition of timeouts_task with its bounds, read from the catalog. The bound expression is
-- rendered in the session's TimeZone and DateStyle and cast back in the same session, so the round
-- trip is exact whatever those settings are. MINVALUE / MAXVALUE bounds come back NULL.
SELECT child.relname AS name,
       bound.expr = 'DEFAULT' AS is_default,
       (regexp_match(bound.expr, 'FROM \(''([^'']*)''\)'))[1]::timestamptz AS lower_bound,
       (regexp_match(bound.expr, 'TO \(''([^'']*)''\)'))[1]::timestamptz AS upper_bound,
       -- -1 until the table was first vacuumed or analyzed: unknown.
       CASE WHEN child.reltuples >= 0 THEN child.reltuples::bigint END AS estimated_rows
FROM pg_inherits AS i
JOIN pg_class AS child ON child.oid = i.inhrelid
CROSS JOIN LATERAL (SELECT pg_get_expr(child.relpartbound, child.oid) AS expr) AS bound
WHERE i.inhparent = 'timeouts_task'::regclass
ORDER BY lower_bound NULLS FIRST, child.relname;


-- name: move_parked_rows
-- Moves the rows of [lower, upper) parked in DEFAULT into the table about to be attached for that range.
--
-- In the transaction that creates and attaches {partition} (ATTACH refuses a range that DEFAULT
-- still holds rows of). Row for row, by position: the table was made LIKE timeouts_task, or was its
-- partition until maintenance detached it, so it has the DEFAULT partition's columns in their order
-- (every table of timeouts_task has them in one order: moving slots between shards copies rows so
-- too). A table with other columns is refused by the ATTACH that follows, and the move undone with it.
WITH moved AS (
    DELETE FROM timeouts_task_default
    WHERE action_time >= %(lower)s AND action_time < %(upper)s
    RETURNING *
)
INSERT INTO {partition}
SELECT * FROM moved;


-- name: default_past_buckets
-- The past buckets that hold rows parked in the DEFAULT partition.
--
-- Buckets before the current one that hold rows parked in DEFAULT (tasks scheduled with an old
-- action_time while no partition covered it). `unit` is hour, day, week (Monday) or month, in UTC.
SELECT date_trunc(%(unit)s, action_time, 'UTC') AS start, count(*) AS rows
FROM timeouts_task_default
WHERE action_time < %(before)s
GROUP BY 1
ORDER BY 1;


-- name: default_rows_between
-- What creating a partition for [lower, upper) would move out of DEFAULT (for dry runs).
SELECT count(*) AS rows
FROM timeouts_task_default
WHERE action_time >= %(lower)s AND action_time < %(upper)s;


-- name: default_row_count
-- How many rows the DEFAULT partition holds.
SELECT count(*) AS rows FROM timeouts_task_default;


-- name: detached_leftovers
-- The partitions this maintenance detached and did not drop yet.
--
-- Tables this maintenance detached to drop but did not drop yet (the process died in between).
-- They are recognised by the comment put on them in the detaching transaction, so a partition an
-- operator detached by hand (to archive it, say) is never touched.
SELECT c.relname AS name
FROM pg_class AS c
WHERE c.relkind = 'r' AND NOT c.relispartition
  AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'timeouts_task'::regclass)
  AND obj_description(c.oid, 'pg_class') = %(marker)s
ORDER BY c.relname;


-- name: try_maintenance_lock
-- Tries to take the session-level advisory lock of a maintenance.
--
-- One maintenance at a time (beat, the command and migrate may overlap). Session-level, so it is
-- held across the per-partition transactions; released by release_maintenance_lock.
SELECT pg_try_advisory_lock(%(namespace)s, %(key)s) AS locked;


-- name: release_maintenance_lock
-- Releases the session-level advisory lock of a maintenance.
SELECT pg_advisory_unlock(%(namespace)s, %(key)s) AS released;


-- name: current_lock_timeout
-- The session's lock_timeout.
SELECT current_setting('lock_timeout') AS value;


-- name: set_local_lock_timeout
-- Sets lock_timeout until the end of the transaction.
--
-- Until the end of the transaction (or of the savepoint, if it is rolled back).
SELECT set_config('lock_timeout', %(value)s, true) AS value;
