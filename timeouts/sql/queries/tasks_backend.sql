-- Tasks of Django's tasks framework (timeouts/backends): rows whose biz_type starts with the prefix
-- of their kind (the parameter prefix: queues.PREFIX), whose attribute is the call (the task's path,
-- its arguments, the backend's alias) and whose result lives in the columns return_value, errors
-- and worker_ids (sql/migrations/0001_tasks.sql). A result id names the row's key, so every statement here finds
-- its row by primary key in one partition. The worker's statements commit without waiting for the WAL flush, as
-- finish_task does: each is followed by running.py's outcome (finish_task, fail_task), which comes
-- later in the WAL, so a crash that loses one of them loses that outcome too, and the task runs
-- again (at least once); the worker saves a disk flush per statement. jsonb comes back as text,
-- which the backend parses: a returned string and a returned JSON document then cannot be
-- confused, whichever loader the connection has.


-- name: tasks_backend_result
-- get_result(): one row by its key.
SELECT job_id, action_time, biz_type, status, attribute::text AS attribute, attempts, max_attempts, last_error,
       created_at, started_at, finished_at, return_value::text AS return_value, errors::text AS errors, worker_ids
FROM timeouts_task
WHERE job_id = %(job_id)s AND action_time = %(action_time)s AND starts_with(biz_type, %(prefix)s);


-- name: tasks_backend_result_moved
-- get_result() of a row whose action_time changed since its id was made.
--
-- get_result() of a row that is no longer where its id says: an operator requeued or rescheduled
-- it (action_time changed). By job_id alone: one probe of each partition's primary key index.
SELECT job_id, action_time, biz_type, status, attribute::text AS attribute, attempts, max_attempts, last_error,
       created_at, started_at, finished_at, return_value::text AS return_value, errors::text AS errors, worker_ids
FROM timeouts_task
WHERE job_id = %(job_id)s AND starts_with(biz_type, %(prefix)s);


-- name: tasks_backend_started
-- Notes the worker that runs an attempt, and reads what earlier attempts left.
--
-- The worker's first statement once the compare-and-set started an attempt: note which worker runs
-- it, and read what earlier attempts left (their errors, their workers), for the TaskResult the
-- task's context and Django's signals carry. Fenced as finish_task: only this attempt's RUNNING row.
UPDATE timeouts_task
SET worker_ids = coalesce(worker_ids, '{}') || %(worker_id)s::text
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS c
WHERE job_id = %(job_id)s AND action_time = %(action_time)s
  AND (status, attempts) IS NOT DISTINCT FROM (:RUNNING, %(attempt)s)
RETURNING errors::text AS errors, worker_ids;


-- name: tasks_backend_returned
-- Stores what the task's function returned, before its DONE.
--
-- What the task's function returned, just before the worker writes DONE (finish_task). If the
-- worker dies between the two, the lease runs out and the task runs again, which writes it anew.
UPDATE timeouts_task
SET return_value = %(return_value)s::jsonb
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS c
WHERE job_id = %(job_id)s AND action_time = %(action_time)s
  AND (status, attempts) IS NOT DISTINCT FROM (:RUNNING, %(attempt)s)
RETURNING job_id;


-- name: tasks_backend_failed
-- Appends a failed attempt's error, before its retry or DEAD.
--
-- The error of a failed attempt, appended, just before the worker writes the retry or DEAD
-- (fail_task).
UPDATE timeouts_task
SET errors = coalesce(errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
        'exception_class_path', %(exception_class_path)s::text, 'traceback', %(traceback)s::text))
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS c
WHERE job_id = %(job_id)s AND action_time = %(action_time)s
  AND (status, attempts) IS NOT DISTINCT FROM (:RUNNING, %(attempt)s)
RETURNING job_id;


-- name: tasks_backend_cancel
-- cancel(result_id): cancels a task that has not started.
--
-- cancel(result_id): a task that has not started. Fenced by the worker's compare-and-set as
-- cancel_task is; a task that ran (DEAD included) is left as it is.
UPDATE timeouts_task
SET status = :CANCELLED, finished_at = c.now, modified_at = c.now, lease_until = NULL
FROM (SELECT clock_timestamp() AS now) AS c
WHERE job_id = %(job_id)s AND action_time = %(action_time)s AND starts_with(biz_type, %(prefix)s)
  AND status IN (:PENDING, :DISPATCHED)
RETURNING job_id, biz_type;
