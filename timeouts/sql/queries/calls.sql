-- Stored Celery calls (DurableTask): their outcome, their starts given back, their cancel.
-- Parameters use Django's %(name)s style, so a literal percent sign is written %%.
--
-- "Now" is the database clock: clock_timestamp() where a statement must see the real time inside a
-- longer transaction, now() in the short claim transactions, where it also lets the planner prune
-- future partitions. A write reads clock_timestamp() in its FROM list (or in the row it inserts),
-- never in an UPDATE's SET nor in a RETURNING list, where distributed PostgreSQL (Citus) refuses
-- a volatile function outright; what else Citus would need is in docs: explanation/shards
-- (tests/unit/store/test_citus_ready.py keeps the rule).
--
-- Calls of Celery tasks stored by DurableTask (timeouts/durable/calls.py): rows whose biz_type starts
-- with the prefix of their kind (the parameter prefix: calls.PREFIX), whose biz_id is the Celery
-- task_id and whose attribute is the call.


-- name: end_call
-- Records a started Celery call's outcome: DONE or DEAD.
--
-- A started call's outcome, fenced as finish_task: DONE when the task returned or handed itself on
-- to a retry (a call of its own), DEAD when it raised (Celery records the failure; an operator may
-- requeue it). `status` is one of those two. Committed without waiting for the WAL flush, as
-- finish_task and for the same reason: an outcome a database crash loses leaves the call RUNNING
-- until its lease runs out, and it runs again (at least once), while the pool process that ran it
-- is free a disk flush sooner for the next call due. `started_at` is when the body started: a start
-- recorded ahead (durable/starts.py) wrote run_at, and the body may have waited for a process since.
UPDATE timeouts_task
SET status = %(status)s, finished_at = c.now, modified_at = c.now, lease_until = NULL, last_error = %(error)s,
    started_at = %(started_at)s
FROM (SELECT clock_timestamp() AS now, set_config('synchronous_commit', 'off', true)) AS c
WHERE job_id = %(job_id)s AND action_time = %(action_time)s
  AND (status, attempts) IS NOT DISTINCT FROM (:RUNNING, %(attempt)s) AND %(status)s IN (:DONE, :DEAD)
RETURNING job_id;


-- name: give_back_call_starts
-- Gives back Celery calls a worker started ahead and will not run: PENDING, attempt unused.
--
-- Calls a worker started ahead (durable/starts.py) and will not run: it is shutting down with their
-- messages still waiting for their eta. Back to PENDING with the attempt unused, as release_claims
-- gives back a claim, so they are published again at once rather than when their leases run out;
-- the waiting message, delivered again, starts the row if it comes before the new one (the
-- compare-and-set takes either, never both).
UPDATE timeouts_task AS t
SET status = :PENDING, attempts = t.attempts - 1, started_at = NULL, lease_until = NULL, modified_at = c.now
FROM unnest(%(job_ids)s::bigint[], %(action_times)s::timestamptz[], %(attempts)s::integer[])
    AS r(job_id, action_time, attempt),
     (SELECT clock_timestamp() AS now) AS c
WHERE t.job_id = r.job_id AND t.action_time = r.action_time AND t.status = :RUNNING AND t.attempts = r.attempt
RETURNING timeouts_notify_v1(%(channel)s, t.run_at, c.now + %(horizon)s * interval '1 second');


-- name: cancel_call
-- Cancels every waiting call of one Celery task_id.
--
-- Every waiting call of one Celery task_id (a retry keeps the task_id), by the (biz_id, biz_type)
-- index. Fenced by the worker's compare-and-set as cancel_task is.
UPDATE timeouts_task
SET status = :CANCELLED, finished_at = c.now, modified_at = c.now, lease_until = NULL
FROM (SELECT clock_timestamp() AS now) AS c
WHERE biz_id = %(task_id)s AND starts_with(biz_type, %(prefix)s) AND status IN (:PENDING, :DISPATCHED)
RETURNING job_id, biz_type;


-- name: end_timed_out_call
-- Marks DEAD the running call of a Celery task_id killed at its hard time limit.
--
-- A started call that Celery killed at its hard time limit (the worker's main process reports it,
-- without the message's fence): DEAD, as Celery records a FAILURE, rather than run again once its
-- lease runs out. Only RUNNING rows of that task_id: a retry's row starts after the first ended.
UPDATE timeouts_task
SET status = :DEAD, finished_at = c.now, modified_at = c.now, lease_until = NULL, last_error = %(error)s
FROM (SELECT clock_timestamp() AS now) AS c
WHERE biz_id = %(task_id)s AND starts_with(biz_type, %(prefix)s) AND status = :RUNNING
RETURNING job_id, biz_type;
