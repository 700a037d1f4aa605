-- schedule(..., on_conflict="error", "keep" or "replace") in one round trip: the key's locks, then
-- its waiting tasks, read (or, to replace them, cancelled) with a snapshot taken after the locks.
--
-- Race-free under READ COMMITTED as timeouts_debounce_v1 is (0001_debounce.sql): it takes the key's
-- advisory locks as lock_biz_key does (its bucket's, shared, then its own), so every caller of one
-- key with an on_conflict, whatever its mode, comes after the one before it has committed; and since
-- a VOLATILE PL/pgSQL function gives each statement a snapshot of its own, the read sees whatever
-- the previous holder of the lock committed. The statement that calls it (schedule_keyed, in
-- sql/queries/scheduling.sql) inserts the new task, when the key has no waiting task or they were
-- replaced, in the same transaction: the lock is held from the read to the insert's commit.
--
-- Returns one row: how many waiting tasks (PENDING or DISPATCHED) the key has, or, with `replace`,
-- how many it cancelled; and the key of the first to run, which it locks (FOR UPDATE reads a row's
-- latest version once its lock is free: a task a worker is starting counts as it is once started).
-- One row always, so that the statement that inserts reads it first.
--
-- timeouts_waiting_for_key_v1 (0001_keyed_schedule.sql) with one change: the read of the first
-- waiting task has no LIMIT. SELECT INTO asks the executor for one row, so only that row is
-- locked, as with LIMIT 1. With the LIMIT, the planner may prefer a plan that yields rows in time
-- order without a sort, walking each partition's (biz_type, action_time) index from its start: it
-- then reads every task of the biz_type to find the key's, on every call. Without it, given the
-- statistics of filled partitions, it finds the key's few rows by (biz_id, biz_type) and sorts
-- them. (A plan made while the partitions are nearly empty, before their first ANALYZE, can
-- still take the other index, and is kept until an ANALYZE replaces it.) v1 stays for the
-- processes of the release before, which call it until they are replaced.
CREATE FUNCTION timeouts_waiting_for_key_v2(
    lock_namespace integer, bucket_namespace integer, bucket_mask integer, key_type text, key_id text,
    replace boolean)
RETURNS TABLE (waiting bigint, first_job_id bigint, first_action_time timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    key_hash integer := hashtext(key_type || ':' || key_id);
BEGIN
    PERFORM pg_advisory_xact_lock_shared(bucket_namespace, key_hash & bucket_mask),
            pg_advisory_xact_lock(lock_namespace, key_hash);
    IF replace THEN
        WITH cancelled AS (
            UPDATE timeouts_task AS t
            SET status = :CANCELLED, finished_at = c.now, modified_at = c.now, lease_until = NULL
            FROM (SELECT clock_timestamp() AS now) AS c
            WHERE t.biz_id = key_id AND t.biz_type = key_type AND t.status IN (:PENDING, :DISPATCHED)
            RETURNING t.job_id
        )
        SELECT count(*) INTO waiting FROM cancelled;
    ELSE
        SELECT t.job_id, t.action_time INTO first_job_id, first_action_time
        FROM timeouts_task AS t
        WHERE t.biz_id = key_id AND t.biz_type = key_type AND t.status IN (:PENDING, :DISPATCHED)
        ORDER BY t.action_time, t.job_id
        FOR UPDATE OF t;
        waiting := CASE WHEN FOUND THEN 1 ELSE 0 END;
    END IF;
    RETURN NEXT;
END
$$;
