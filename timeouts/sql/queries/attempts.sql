-- The worker's side of an attempt: its start by compare-and-set, its lease, its outcome.
-- Parameters use Django's %(name)s style, so a literal percent sign is written %%.
--
-- "Now" is the database clock: clock_timestamp() where a statement must see the real time inside a
-- longer transaction, now() in the short claim transactions, where it also lets the planner prune
-- future partitions. A write reads clock_timestamp() in its FROM list (or in the row it inserts),
-- never in an UPDATE's SET nor in a RETURNING list, where distributed PostgreSQL (Citus) refuses
-- a volatile function outright; what else Citus would need is in docs: explanation/shards
-- (tests/unit/store/test_citus_ready.py keeps the rule).


-- part: start_or_end_late
-- The SET of a start: RUNNING with a lease, or the task ended if its policy says it is too late.
--
-- The SET of the worker's compare-and-set (start_task, and a batch's start after a DONE). An
-- attempt that starts more than its biz_type's max_lateness after its run_at (the time it was due:
-- action_time for a first attempt, the end of its backoff for a retry) with on_late "skip" or
-- "dead" does not start: the task ends CANCELLED or DEAD at once, its attempts and started_at as
-- they were, and last_error says how late it was (timeouts/limiting/lateness.py reads its first
-- words).
-- Decided by the database clock, in the statement that starts, so a cancel that committed first
-- still wins and one that comes after finds the task ended. The policy in force is read from
-- timeouts_limits (one probe of its primary key; no row, or no policy: the start goes on as ever).
-- A task whose last_error says that a late start ended it has been requeued since (nothing else
-- brings it back): an operator asked for it to run, so that attempt runs however late.
SET (status, attempts, started_at, lease_until, finished_at, last_error) = (
        SELECT coalesce(late.status, :RUNNING),
               timeouts_task.attempts + CASE WHEN late.status IS NULL THEN 1 ELSE 0 END,
               CASE WHEN late.status IS NULL THEN greatest(timeouts_task.run_at, c.now)
                    ELSE timeouts_task.started_at END,
               CASE WHEN late.status IS NULL
                    THEN greatest(timeouts_task.run_at, c.now) + (timeouts_task.ttr + %(lease_extra)s) * interval '1 second'
               END,
               CASE WHEN late.status IS NOT NULL THEN c.now END,
               coalesce(late.error, timeouts_task.last_error)
        FROM (SELECT) AS one
        LEFT JOIN (
            SELECT CASE l.on_late_in_force WHEN 'skip' THEN :CANCELLED ELSE :DEAD END AS status,
                   format('not run: started %%s s after its time, over max_lateness %%s s (on_late=%%s)',
                          round(extract(epoch FROM c.now - timeouts_task.run_at), 1),
                          trim_scale(extract(epoch FROM l.max_lateness_in_force)), l.on_late_in_force) AS error
            FROM timeouts_limits AS l
            WHERE l.biz_type = timeouts_task.biz_type AND l.on_late_in_force IN ('skip', 'dead')
              AND c.now - timeouts_task.run_at > l.max_lateness_in_force
              AND NOT starts_with(timeouts_task.last_error, 'not run: started ')
        ) AS late ON true
    ),
    modified_at = c.now


-- part: ran_late
-- A RETURNING column of a start: true when it started later than a policy of on_late "run" allows.
--
-- Such a start runs (on_late "run"), and is counted as late (timeouts/limiting/lateness.py). NULL
-- otherwise.
CASE WHEN timeouts_task.status = :RUNNING THEN (
    SELECT true FROM timeouts_limits AS l
    WHERE l.biz_type = timeouts_task.biz_type AND l.on_late_in_force = 'run'
      AND c.now - timeouts_task.run_at > l.max_lateness_in_force) END AS ran_late


-- name: start_task
-- The worker's compare-and-set: starts the attempt of a claimed task (RUNNING, with a lease).
--
-- The worker's compare-and-set: only the message of the current dispatch (same attempt number,
-- still DISPATCHED, due by the database clock) may start the handler. A cancel that committed
-- first changed the status, so this matches nothing and the handler never runs. The lease is the
-- TTR, plus what is left of a batch's budget (lease_extra): Celery's time limit on the batch.
-- The state is compared with IS NOT DISTINCT FROM (`=` for these NOT NULL columns) so that only
-- the primary key can find the row: see queries.py, ON_PARTITION.
-- `ahead` (seconds, 0 but for stored Celery calls) lets the start be recorded up to that much
-- before run_at, as starting at run_at: the worker then waits out the rest by the database clock
-- (database_now) before the body starts, and the durable commit is not in its lateness.
-- A start later than its biz_type's lateness policy allows ends the task instead (the part
-- start_or_end_late, above).
UPDATE timeouts_task
{start_or_end_late}
FROM (SELECT clock_timestamp() AS now) AS c
WHERE job_id = %(job_id)s AND action_time = %(action_time)s
  AND (status, attempts) IS NOT DISTINCT FROM (:DISPATCHED, %(attempt)s - 1)
  AND run_at <= c.now + %(ahead)s * interval '1 second'
RETURNING timeouts_task.*, c.now AS database_now,
    {ran_late};


-- name: start_calls_ahead
-- The compare-and-set starts of several stored Celery calls received ahead, on one partition.
--
-- start_task's, ahead, for the calls that one claim published together and that reach a worker's
-- main process together (durable/starts.py): their starts, each a durable commit, share one. It runs
-- on the partition the claim returned; a call not found there (its row moved, or its message is
-- stale) is tried alone through the parent (start_task), as start_task's own shortcut does. Only
-- the primary key serves the lookup (`job_id = ANY`; the rest compared with IS NOT DISTINCT FROM,
-- as in start_task), so the rows are locked in its order, whatever the order of the arrays.
UPDATE {partition} AS timeouts_task
{start_or_end_late}
FROM unnest(%(job_ids)s::bigint[], %(action_times)s::timestamptz[], %(attempts)s::integer[])
    AS r(job_id, action_time, attempt),
     (SELECT clock_timestamp() AS now) AS c
WHERE timeouts_task.job_id = ANY(%(job_ids)s::bigint[]) AND timeouts_task.job_id = r.job_id
  AND timeouts_task.action_time IS NOT DISTINCT FROM r.action_time
  AND (timeouts_task.status, timeouts_task.attempts) IS NOT DISTINCT FROM (:DISPATCHED, r.attempt - 1)
  AND timeouts_task.run_at <= c.now + %(ahead)s * interval '1 second'
RETURNING timeouts_task.*, c.now AS database_now,
    {ran_late};


-- name: task_state
-- One task's status, attempts and run_at, beside the database clock.
SELECT status, attempts, run_at, clock_timestamp() AS now
FROM timeouts_task
WHERE job_id = %(job_id)s AND action_time = %(action_time)s;


-- name: finish_task
-- Marks a running attempt DONE.
--
-- Committed without waiting for the WAL flush (synchronous_commit off, for this statement's own
-- transaction only): if a database crash loses it, the task is still RUNNING, its lease runs out
-- and it runs again: at least once still holds, and the worker saves a disk flush per task. The
-- start (start_task) stays durable: a cancel() must never succeed after a handler started.
-- The state is compared as in start_task.
UPDATE timeouts_task
SET status = :DONE, finished_at = c.now, modified_at = c.now, lease_until = NULL
FROM (SELECT clock_timestamp() AS now, set_config('synchronous_commit', 'off', true)) AS c
WHERE job_id = %(job_id)s AND action_time = %(action_time)s
  AND (status, attempts) IS NOT DISTINCT FROM (:RUNNING, %(attempt)s)
RETURNING job_id;


-- name: finish_then_start_task
-- Marks a batch's previous task DONE and starts its next one, in one statement.
--
-- A batch's previous task's DONE (as finish_task, done_ parameters) and its next task's start (as
-- start_task) in one statement: one round trip and one durable commit, where the two statements
-- cost a durable commit and one without a flush, which then delays the durable one (docs:
-- explanation/benchmarks). Nothing runs between a handler's end and the next one's start, so
-- writing the DONE there changes no outcome; it only becomes durable.
-- Always one row: `finished` says whether the DONE matched; the start's columns are NULL when the
-- start matched nothing (a stale or early message: running.py goes on as after start_task). The
-- start is start_task's, lateness policy included.
-- test_batches checks that it leaves both rows as the two queries do.
WITH c AS (SELECT clock_timestamp() AS now),
finished AS (
UPDATE timeouts_task
SET status = :DONE, finished_at = c.now, modified_at = c.now, lease_until = NULL
FROM c
WHERE job_id = %(done_job_id)s AND action_time = %(done_action_time)s
  AND (status, attempts) IS NOT DISTINCT FROM (:RUNNING, %(done_attempt)s)
RETURNING job_id
),
started AS (
UPDATE timeouts_task
{start_or_end_late}
FROM c
WHERE job_id = %(job_id)s AND action_time = %(action_time)s
  AND (status, attempts) IS NOT DISTINCT FROM (:DISPATCHED, %(attempt)s - 1) AND run_at <= c.now
RETURNING timeouts_task.*, c.now AS database_now,
    {ran_late}
)
SELECT EXISTS (SELECT FROM finished) AS finished, started.*
FROM (SELECT) AS one LEFT JOIN started ON true;


-- name: fail_task
-- A raising handler: back to PENDING after a backoff, or DEAD once attempts are used up.
UPDATE timeouts_task
SET status = CASE WHEN attempts >= max_attempts THEN :DEAD ELSE :PENDING END,
    run_at = CASE WHEN attempts >= max_attempts THEN run_at
                  ELSE greatest(run_at, c.now + %(backoff)s * interval '1 second') END,
    finished_at = CASE WHEN attempts >= max_attempts THEN c.now END,
    last_error = %(error)s, lease_until = NULL, modified_at = c.now
FROM (SELECT clock_timestamp() AS now) AS c
WHERE job_id = %(job_id)s AND action_time = %(action_time)s AND status = :RUNNING AND attempts = %(attempt)s
RETURNING status, timeouts_notify_v1(%(channel)s, CASE WHEN status = :PENDING THEN run_at END, c.now + %(horizon)s * interval '1 second') AS notified;


-- name: confirm_start
-- Confirms, right before its body, that a call started ahead still holds, and renews its lease.
--
-- Right before the body of a call whose start the worker's main process recorded ahead
-- (durable/starts.py), maybe long before if it waited for a pool process: that start still holds
-- (RUNNING for this attempt: lease recovery moves a started call on, nothing else does) and its
-- lease is renewed for a whole TTR, which the pool process's heartbeat (leases.py) then keeps.
-- Matching nothing, the call is not run. Committed without waiting for the WAL flush: a database
-- crash that loses it leaves the lease as it was, and the call may run again (at least once), while
-- the body starts a disk flush sooner. The state is compared as in start_task.
UPDATE timeouts_task
SET lease_until = c.now + ttr * interval '1 second'
FROM (SELECT clock_timestamp() AS now, set_config('synchronous_commit', 'off', true)) AS c
WHERE job_id = %(job_id)s AND action_time = %(action_time)s
  AND (status, attempts) IS NOT DISTINCT FROM (:RUNNING, %(attempt)s)
RETURNING job_id;


-- name: extend_leases
-- Extends the leases of running attempts a worker process keeps alive.
--
-- The leases a worker process keeps alive (leases.py: DurableTask calls, calls started ahead that
-- wait for a pool process, handlers in a pool without hard time limits), fenced as finish_task: such
-- a task is not taken for lost while its process lives, and the leases of a process that died run
-- out as before.
UPDATE timeouts_task AS t
SET lease_until = c.now + t.ttr * interval '1 second'
FROM unnest(%(job_ids)s::bigint[], %(action_times)s::timestamptz[], %(attempts)s::integer[])
    AS r(job_id, action_time, attempt),
     (SELECT clock_timestamp() AS now) AS c
WHERE t.job_id = r.job_id AND t.action_time = r.action_time AND t.status = :RUNNING AND t.attempts = r.attempt
RETURNING t.job_id;
