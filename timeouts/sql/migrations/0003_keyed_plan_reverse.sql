-- Back to timeouts_waiting_for_key_v2 as 0002_keyed_schedule.sql made it.
CREATE OR REPLACE FUNCTION timeouts_waiting_for_key_v2(
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
