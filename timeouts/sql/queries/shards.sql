-- Moving whole slots between shards (see timeouts/resharding.py). Parameters use Django's
-- %(name)s style. Not a hot path: they run in a quiet window, with every process stopped.


-- name: slot_rows
-- COPYs the rows of some slots out of the source shard.
--
-- The rows of the slots, as COPY reads them out of the source shard (the slot is the job_id's low
-- ten bits: shards.py). Bound on the client: COPY takes no server-side parameters.
COPY (SELECT * FROM timeouts_task WHERE job_id & 1023 = ANY(%(slots)s::int[])) TO STDOUT (FORMAT BINARY);


-- name: slot_rows_in_flight
-- Rows of the slots that a worker or a dispatcher holds: moving them would run them twice.
SELECT count(*) AS rows FROM timeouts_task
WHERE job_id & 1023 = ANY(%(slots)s::int[]) AND status IN (:DISPATCHED, :RUNNING);


-- name: create_moving_rows
-- Creates the temporary table the rows moving to this shard are copied into.
CREATE TEMPORARY TABLE timeouts_moving_rows (LIKE timeouts_task) ON COMMIT DROP;


-- name: copy_moving_rows
-- COPYs the moving rows into that temporary table.
COPY timeouts_moving_rows FROM STDIN (FORMAT BINARY);


-- name: insert_moving_rows
-- Inserts the moving rows into this shard's partitions, once each.
--
-- Into the target shard's partitions. A row already there was copied by an earlier run that
-- stopped before it deleted the source's: it is the same row, kept once.
INSERT INTO timeouts_task SELECT * FROM timeouts_moving_rows ON CONFLICT DO NOTHING;


-- name: delete_slot_rows
-- Deletes the rows of some slots from the source shard.
DELETE FROM timeouts_task WHERE job_id & 1023 = ANY(%(slots)s::int[]);


-- name: last_sequence_value
-- The last value of the job_id sequence.
SELECT last_value AS value FROM timeouts_task_job_id_seq;


-- name: raise_sequence
-- Raises the job_id sequence to at least `value`.
--
-- Never lowers it: a shard's new job_ids stay above every id it may have been given.
SELECT setval('timeouts_task_job_id_seq', greatest(%(value)s, (SELECT last_value FROM timeouts_task_job_id_seq)));


-- name: limits_rows
-- The limits, overrides and pauses of every biz_type, for a shard that has none of its own yet.
SELECT biz_type, declared_rate_limit, declared_concurrency, overridden, rate_limit, concurrency, paused
FROM timeouts_limits
ORDER BY biz_type;


-- name: insert_limits_row
-- Copies one biz_type's limits row to a shard that has none.
INSERT INTO timeouts_limits
    (biz_type, declared_rate_limit, declared_concurrency, overridden, rate_limit, concurrency, paused)
VALUES (%(biz_type)s, %(declared_rate_limit)s, %(declared_concurrency)s, %(overridden)s, %(rate_limit)s,
        %(concurrency)s, %(paused)s)
ON CONFLICT (biz_type) DO NOTHING;
