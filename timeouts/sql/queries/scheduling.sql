-- Creating tasks: one INSERT, the job ids of a COPY, and the key lock of on_conflict.
-- Parameters use Django's %(name)s style, so a literal percent sign is written %%.
--
-- "Now" is the database clock: clock_timestamp() where a statement must see the real time inside a
-- longer transaction, now() in the short claim transactions, where it also lets the planner prune
-- future partitions. A write reads clock_timestamp() in its FROM list (or in the row it inserts),
-- never in an UPDATE's SET nor in a RETURNING list, where distributed PostgreSQL (Citus) refuses
-- a volatile function outright; what else Citus would need is in docs: explanation/shards
-- (tests/unit/store/test_citus_ready.py keeps the rule).


-- name: insert_task
-- Inserts one task and wakes the dispatchers when it is due within their horizon.
--
-- One new task, inside a transaction that may do more. With delay=, the database adds it to its
-- own clock (statement_timestamp(): one value for the whole statement, so action_time = run_at and
-- created_at = modified_at). Wakes the dispatchers when the task is due within the horizon (one
-- round trip for both) through timeouts_notify_v1, which sends at most one NOTIFY per transaction;
-- the CASE calls it only then, since a PL/pgSQL call costs more than the comparison. For a
-- statement that is its own transaction, queries.py derives insert_task_autocommit, which calls
-- pg_notify() itself. Returns what the database decided (the caller knows the rest; the attribute
-- as jsonb gives it back, which can differ from what was passed: 1e16 comes back an int), in this
-- order: this is schedule()'s hot path, and every column returned costs (a CTE returning the row
-- costs more still). The job_id carries the task's slot in its low bits (shards.py). trace_context:
-- the caller's, with OpenTelemetry and an active span (tracing.py), else NULL.
INSERT INTO timeouts_task
{new_task_columns}
VALUES (
    {new_task_values}
)
RETURNING
    {new_task_returned};


-- part: new_task_columns
-- The columns of a new task's row, as insert_task and schedule_keyed give them.
(job_id, biz_type, biz_id, action_time, run_at, attribute, max_attempts, ttr, created_at, modified_at,
 trace_context)


-- part: new_task_values
-- The values of a new task's row (new_task_columns), from schedule()'s parameters.
nextval('timeouts_task_job_id_seq') * 1024 + %(slot)s, %(biz_type)s, %(biz_id)s,
coalesce(%(at)s::timestamptz, statement_timestamp() + %(delay)s::interval),
coalesce(%(at)s::timestamptz, statement_timestamp() + %(delay)s::interval),
%(attribute)s::jsonb, %(max_attempts)s, %(ttr)s, statement_timestamp(), statement_timestamp(),
%(trace_context)s::text


-- part: new_task_returned
-- What insert_task and schedule_keyed return of the new task, and whether they woke the dispatchers.
job_id, action_time, attribute, created_at,
CASE WHEN run_at <= created_at + %(horizon)s * interval '1 second'
     THEN timeouts_notify_v1(%(channel)s, run_at, created_at + %(horizon)s * interval '1 second')
     ELSE false END AS notified


-- name: schedule_keyed
-- Inserts one task unless its key has one waiting, or in place of those, under the key's lock, in one round trip.
--
-- schedule() with on_conflict "error", "keep" or "replace", outside a transaction: the statement is
-- its own transaction, and holds the key's lock from the read to the insert
-- (timeouts_waiting_for_key_v2, in sql/migrations/0002_keyed_schedule.sql, says why that is
-- race-free). The function's one row comes first: the insert reads it. The new task's row is
-- insert_task's; it is inserted when the key has no waiting task, or with `replace`, after the
-- function cancelled them. Returns insert_task's columns (NULL when nothing was inserted), then the
-- function's: `waiting` (with `replace`: cancelled) and the key of the first waiting task.
-- queries.py makes it notify as insert_task_autocommit does. Prepared (on schedule()'s path by
-- default): the casts give its parameters their types.
WITH waiting AS MATERIALIZED (
    SELECT * FROM timeouts_waiting_for_key_v2(%(namespace)s::integer, %(bucket_namespace)s::integer,
                                              %(bucket_mask)s::integer, %(biz_type)s::text, %(biz_id)s::text,
                                              %(replace)s::boolean)
), inserted AS (
    INSERT INTO timeouts_task
    {new_task_columns}
    SELECT
        {new_task_values}
    FROM waiting
    WHERE waiting.waiting = 0 OR %(replace)s::boolean
    RETURNING
        {new_task_returned}
)
SELECT inserted.*, waiting.*
FROM waiting LEFT JOIN inserted ON true;


-- name: task_at
-- One task by its database key (job_id and action_time): the waiting task that "keep" keeps.
SELECT * FROM timeouts_task WHERE job_id = %(job_id)s AND action_time = %(action_time)s;


-- name: next_job_ids
-- Sequence values for bulk_schedule()'s COPY, which computes the job_ids as insert_task does.
SELECT array(SELECT nextval('timeouts_task_job_id_seq') FROM generate_series(1, %(count)s)) AS values;


-- name: notify_deadline
-- Wakes the dispatchers for a deadline within their horizon (at most once per transaction).
SELECT timeouts_notify_v1(%(channel)s, %(deadline)s, clock_timestamp() + %(horizon)s * interval '1 second');


-- name: lock_biz_key
-- Takes the transaction-level advisory lock of one (biz_type, biz_id), after a shared lock on its bucket.
--
-- Serialises on_conflict scheduling of one (biz_type, biz_id) until the transaction ends.
-- Hash collisions only make two keys wait for each other; they never merge them. The bucket's
-- shared lock comes first (a select list is evaluated in its order): a batch too large to lock key
-- by key takes its buckets' locks exclusively instead (lock_biz_keys). Prepared (on schedule()'s
-- path by default): the casts give its parameters their types.
SELECT pg_advisory_xact_lock_shared(%(bucket_namespace)s::integer, key.hash & %(bucket_mask)s::integer),
       pg_advisory_xact_lock(%(namespace)s::integer, key.hash)
FROM (SELECT hashtext(%(biz_type)s::text || ':' || %(biz_id)s::text) AS hash) AS key;


-- name: debounce_task
-- Moves the key's PENDING task to a new time and attribute, under the key's lock, or says when a new one is due.
--
-- schedule(..., on_conflict="debounce") in one round trip (timeouts_debounce_v1, in
-- sql/migrations/0001_debounce.sql, which says why it is race-free): the moved task's row, or NULLs
-- and `due`, the time of the task the caller then inserts under the same lock. Prepared (on
-- schedule()'s path): the casts give its parameters their types.
SELECT (d.task).*, d.due
FROM timeouts_debounce_v1(%(namespace)s::integer, %(bucket_namespace)s::integer, %(bucket_mask)s::integer,
                          %(biz_type)s::text, %(biz_id)s::text, %(at)s::timestamptz, %(delay)s::interval,
                          %(max_wait)s::interval, %(attribute)s::jsonb, %(channel)s::text,
                          %(horizon)s::double precision) AS d;


-- name: waiting_tasks_for_key
-- Tasks of one key that have not started yet (PENDING or DISPATCHED).
SELECT * FROM timeouts_task
WHERE biz_id = %(biz_id)s AND biz_type = %(biz_type)s AND status IN (:PENDING, :DISPATCHED)
ORDER BY action_time, job_id
FOR UPDATE;


-- name: lock_biz_keys
-- Takes the transaction-level advisory locks of many (biz_type, biz_id), or of their buckets, in one order.
--
-- bulk_schedule()'s lock_biz_key for all its keys in one round trip: the shared locks of their
-- buckets, then their own; with `by_bucket` (a batch of more keys than the lock table should hold
-- for one transaction), their buckets' locks, exclusively. Every caller takes buckets before keys,
-- each in the order of its id (the subquery's sort, which the outer query keeps: a subquery with
-- ORDER BY is not pulled up, and the aggregate takes each lock as its row comes), so two callers
-- never wait for each other in a circle.
WITH key AS (
    SELECT hashtext(given.biz_type || ':' || given.biz_id) AS hash
    FROM unnest(%(biz_types)s::text[], %(biz_ids)s::text[]) AS given(biz_type, biz_id)
)
SELECT count(CASE WHEN NOT lock.is_bucket THEN pg_advisory_xact_lock(%(namespace)s, lock.id) IS NOT NULL
                  WHEN %(by_bucket)s THEN pg_advisory_xact_lock(%(bucket_namespace)s, lock.id) IS NOT NULL
                  ELSE pg_advisory_xact_lock_shared(%(bucket_namespace)s, lock.id) IS NOT NULL END)
FROM (SELECT DISTINCT is_bucket, id
      FROM (SELECT true AS is_bucket, hash & %(bucket_mask)s AS id FROM key
            UNION ALL
            SELECT false, hash FROM key WHERE NOT %(by_bucket)s) AS wanted
      ORDER BY is_bucket DESC, id) AS lock;


-- name: waiting_tasks_for_keys
-- Tasks of many keys that have not started yet (PENDING or DISPATCHED).
--
-- With what a debounced item needs of the PENDING ones: their deadline and their first scheduling.
SELECT job_id, action_time, biz_type, biz_id, status, run_at, created_at FROM timeouts_task
WHERE (biz_type, biz_id) IN (SELECT * FROM unnest(%(biz_types)s::text[], %(biz_ids)s::text[]))
  AND status IN (:PENDING, :DISPATCHED)
ORDER BY biz_type, biz_id, action_time, job_id
FOR UPDATE;


-- name: move_waiting_tasks
-- Moves the PENDING tasks at these (job_id, action_time) to new times, with new attributes: those bulk_schedule() debounces.
--
-- Locked above (waiting_tasks_for_keys, FOR UPDATE), so still PENDING; the times and attributes are
-- bulk_schedule()'s, computed from one reading of the database clock.
UPDATE timeouts_task AS t
SET action_time = m.due, run_at = m.due, attribute = m.attribute::jsonb, modified_at = c.now
FROM unnest(%(job_ids)s::bigint[], %(action_times)s::timestamptz[], %(dues)s::timestamptz[],
            %(attributes)s::text[]) AS m(job_id, action_time, due, attribute),
     (SELECT clock_timestamp() AS now) AS c
WHERE t.job_id = m.job_id AND t.action_time = m.action_time AND t.status = :PENDING
RETURNING t.job_id;


-- name: cancel_waiting_tasks
-- Cancels the tasks at these (job_id, action_time) that have not started: those bulk_schedule() replaces.
UPDATE timeouts_task
SET status = :CANCELLED, finished_at = c.now, modified_at = c.now, lease_until = NULL
FROM (SELECT clock_timestamp() AS now) AS c
WHERE (job_id, action_time) IN (SELECT * FROM unnest(%(job_ids)s::bigint[], %(action_times)s::timestamptz[]))
  AND status IN (:PENDING, :DISPATCHED)
RETURNING biz_type;
