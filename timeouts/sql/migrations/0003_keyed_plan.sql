-- timeouts_waiting_for_key_v2 (0002_keyed_schedule.sql), its plans made safe whatever the statistics.
--
-- PL/pgSQL keeps a generic plan for each statement of the function once its first calls have shown
-- one to be no worse, and keeps it for the life of the connection, whatever the table grows to.
-- Made while the partitions were nearly empty, or had no statistics (a new table, autovacuum off
-- or behind), such a plan may find the key's rows through a partition's (biz_type, action_time)
-- index, by biz_type alone or for its order: it then reads every waiting task of the biz_type on
-- every call. So the key's rows are matched by a biz_type expression no index serves, and ordered
-- by an expression of action_time no index gives: the key's own (biz_id, biz_type) index, by its
-- biz_id, is then the only index their conditions can use. Same signature and meaning: the
-- processes that call v2 go on calling it.
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
            WHERE t.biz_id = key_id AND t.biz_type || '' = key_type AND t.status IN (:PENDING, :DISPATCHED)
            RETURNING t.job_id
        )
        SELECT count(*) INTO waiting FROM cancelled;
    ELSE
        SELECT t.job_id, t.action_time INTO first_job_id, first_action_time
        FROM timeouts_task AS t
        WHERE t.biz_id = key_id AND t.biz_type || '' = key_type AND t.status IN (:PENDING, :DISPATCHED)
        ORDER BY t.action_time + interval '0 seconds', t.job_id
        FOR UPDATE OF t;
        waiting := CASE WHEN FOUND THEN 1 ELSE 0 END;
    END IF;
    RETURN NEXT;
END
$$;
