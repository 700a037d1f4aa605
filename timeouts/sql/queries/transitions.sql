-- State changes users ask for: cancel, reschedule, requeue.
-- Parameters use Django's %(name)s style, so a literal percent sign is written %%.
--
-- "Now" is the database clock: clock_timestamp() where a statement must see the real time inside a
-- longer transaction, now() in the short claim transactions, where it also lets the planner prune
-- future partitions. A write reads clock_timestamp() in its FROM list (or in the row it inserts),
-- never in an UPDATE's SET nor in a RETURNING list, where distributed PostgreSQL (Citus) refuses
-- a volatile function outright; what else Citus would need is in docs: explanation/shards
-- (tests/unit/store/test_citus_ready.py keeps the rule).


-- name: cancel_by_key
-- Cancels the tasks of one (biz_type, biz_id) that are in one of `statuses`, saying which had not started.
--
-- The rows are locked first (FOR UPDATE, which reads a row's latest version once its lock is
-- free), so `was_waiting` is the status each had when it was cancelled: timeouts.cancel() answers
-- whether one of them had not started yet, which a discarded DEAD task has.
WITH target AS (
    SELECT job_id, action_time, status FROM timeouts_task
    WHERE biz_id = %(biz_id)s AND biz_type = %(biz_type)s AND status = ANY(%(statuses)s::smallint[])
    FOR UPDATE
)
UPDATE timeouts_task
SET status = :CANCELLED, finished_at = c.now, modified_at = c.now, lease_until = NULL
FROM target, (SELECT clock_timestamp() AS now) AS c
WHERE timeouts_task.job_id = target.job_id AND timeouts_task.action_time = target.action_time
RETURNING timeouts_task.job_id, target.status IN (:PENDING, :DISPATCHED) AS was_waiting;


-- name: cancel_task
-- Cancels one task that has not started (or discards a DEAD one).
--
-- PENDING and DISPATCHED tasks have not started: cancelling them is fenced by the worker's
-- compare-and-set (which needs status DISPATCHED). DEAD ones are discarded.
UPDATE timeouts_task
SET status = :CANCELLED, finished_at = c.now, modified_at = c.now, lease_until = NULL
FROM (SELECT clock_timestamp() AS now) AS c
WHERE job_id = %(job_id)s AND action_time = %(action_time)s AND status IN (:PENDING, :DISPATCHED, :DEAD)
RETURNING timeouts_task.*;


-- name: find_task
-- Finds one task by its job_id alone.
--
-- By job id alone: probes every partition's primary-key index. Only for rare paths.
SELECT * FROM timeouts_task WHERE job_id = %(job_id)s;


-- name: reschedule_task
-- Moves one waiting task to a new time, back to PENDING, and wakes the dispatchers if due soon.
--
-- Changing action_time moves the row to another partition when it crosses a bucket boundary.
-- Both readings of the clock are in one subquery: a nested subquery for `now` would add its
-- planning to every call.
UPDATE timeouts_task
SET action_time = due.t, run_at = due.t, status = :PENDING, lease_until = NULL, modified_at = due.now
FROM (SELECT coalesce(%(at)s::timestamptz, clock_timestamp() + %(delay)s::interval) AS t,
             clock_timestamp() AS now) AS due
WHERE job_id = %(job_id)s AND action_time = %(action_time)s AND status IN (:PENDING, :DISPATCHED)
RETURNING timeouts_task.*,
    timeouts_notify_v1(%(channel)s, due.t, due.now + %(horizon)s * interval '1 second') AS notified;


-- name: requeue_task
-- Brings a CANCELLED or DEAD task back to PENDING, due now, with its attempts reset.
UPDATE timeouts_task
SET status = :PENDING, action_time = c.now, run_at = c.now, attempts = 0, lease_until = NULL,
    started_at = NULL, finished_at = NULL, modified_at = c.now
FROM (SELECT clock_timestamp() AS now) AS c
WHERE job_id = %(job_id)s AND action_time = %(action_time)s AND status IN (:CANCELLED, :DEAD)
RETURNING timeouts_task.*, timeouts_notify_v1(%(channel)s, c.now, c.now) AS notified;


-- name: reschedule_by_key
-- Moves the waiting tasks of one (biz_type, biz_id) to a new time, back to PENDING, and wakes the dispatchers if due soon.
--
-- reschedule_task for every task of the key that has not started (at most one where the key is
-- scheduled with on_conflict).
UPDATE timeouts_task
SET action_time = due.t, run_at = due.t, status = :PENDING, lease_until = NULL, modified_at = due.now
FROM (SELECT coalesce(%(at)s::timestamptz, clock_timestamp() + %(delay)s::interval) AS t,
             clock_timestamp() AS now) AS due
WHERE biz_id = %(biz_id)s AND biz_type = %(biz_type)s AND status IN (:PENDING, :DISPATCHED)
RETURNING timeouts_task.job_id,
    timeouts_notify_v1(%(channel)s, due.t, due.now + %(horizon)s * interval '1 second') AS notified;


-- name: requeue_latest_of_key
-- Brings the latest task of one (biz_type, biz_id) back to PENDING, due now, if it is CANCELLED or DEAD.
--
-- The latest: the key's last scheduled task, whatever became of the ones before it (a task that a
-- "replace" cancelled stays cancelled). Not while another task of the key waits to run: the key's
-- advisory lock, taken first in the same transaction, keeps schedule() with on_conflict from
-- adding one meanwhile.
WITH latest AS (
    SELECT job_id, action_time, status FROM timeouts_task
    WHERE biz_id = %(biz_id)s AND biz_type = %(biz_type)s
    ORDER BY created_at DESC, job_id DESC
    LIMIT 1
    FOR UPDATE
)
UPDATE timeouts_task
SET status = :PENDING, action_time = c.now, run_at = c.now, attempts = 0, lease_until = NULL,
    started_at = NULL, finished_at = NULL, modified_at = c.now
FROM latest, (SELECT clock_timestamp() AS now) AS c
WHERE timeouts_task.job_id = latest.job_id AND timeouts_task.action_time = latest.action_time
  AND latest.status IN (:CANCELLED, :DEAD)
  AND NOT EXISTS (SELECT FROM timeouts_task AS other
                  WHERE other.biz_id = %(biz_id)s AND other.biz_type = %(biz_type)s
                    AND other.status IN (:PENDING, :DISPATCHED))
RETURNING timeouts_task.job_id, timeouts_notify_v1(%(channel)s, c.now, c.now) AS notified;
