-- timeouts_debounce_v1 (0001_debounce.sql), its plan made safe whatever the statistics, as
-- 0003_keyed_plan.sql made timeouts_waiting_for_key_v2's.
--
-- PL/pgSQL keeps a generic plan for each statement of the function once its first calls have shown
-- one to be no worse, and keeps it for the life of the connection, whatever the table grows to.
-- Made while the partitions were nearly empty, or had no statistics, the plan of the read of the
-- key's PENDING task may find it by walking the whole of an index of the PENDING tasks (their
-- (run_at), or (biz_type, run_at)), whose condition the read's own implies, or by biz_type alone:
-- it then reads every PENDING task, or every one of the biz_type, on every call. So the key's
-- biz_type and status are matched by expressions no index and no index's condition serves, and
-- the key's own (biz_id, biz_type) index, by its biz_id, is the only index the read can use.
-- Same signature and meaning: the processes that call v1 go on calling it.
CREATE OR REPLACE FUNCTION timeouts_debounce_v1(
    lock_namespace integer, bucket_namespace integer, bucket_mask integer, key_type text, key_id text,
    new_at timestamptz, new_delay interval, max_wait interval, new_attribute jsonb,
    channel text, horizon double precision)
RETURNS TABLE (task timeouts_task, due timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    key_hash integer := hashtext(key_type || ':' || key_id);
    clock timestamptz;
    wanted timestamptz;
    first_scheduled timestamptz;
    was_due timestamptz;
    waiting record;
    moving boolean;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(bucket_namespace, key_hash & bucket_mask),
            pg_advisory_xact_lock(lock_namespace, key_hash);
    clock := clock_timestamp();
    wanted := coalesce(new_at, clock + new_delay);
    -- The key's first PENDING task: with on_conflict there is one at most, but tasks scheduled
    -- beside it with on_conflict=None may be PENDING too. Its biz_type and status are matched by
    -- expressions no index serves, so that whatever plan is kept, only the key's own index finds it.
    SELECT t.job_id, t.action_time, t.run_at, t.created_at INTO waiting
    FROM timeouts_task AS t
    WHERE t.biz_id = key_id AND t.biz_type || '' = key_type AND t.status + 0 = :PENDING
    ORDER BY t.created_at, t.job_id
    LIMIT 1
    FOR UPDATE;
    moving := FOUND;
    IF moving THEN
        first_scheduled := waiting.created_at;
        was_due := waiting.action_time;
    ELSE
        first_scheduled := clock;
        was_due := clock;
    END IF;
    -- Compared as intervals: a max_wait too large to add to a time is never added to one.
    IF max_wait IS NULL OR wanted - first_scheduled <= max_wait THEN
        due := wanted;
    ELSE
        -- The cap; unless it passed before both the time the task was due and now (the task was
        -- first scheduled without a max_wait, or with a larger one): then the earlier of those,
        -- not a time long past, from which its lateness would count.
        due := least(wanted, greatest(first_scheduled + max_wait, least(was_due, clock)));
    END IF;
    IF NOT moving THEN  -- the caller creates the task
        task := NULL;
        RETURN NEXT;
        RETURN;
    END IF;
    UPDATE timeouts_task AS t
    SET action_time = due, run_at = due, attribute = new_attribute, modified_at = clock
    WHERE t.job_id = waiting.job_id AND t.action_time = waiting.action_time
    RETURNING t.* INTO task;
    IF due < waiting.run_at THEN
        PERFORM timeouts_notify_v1(channel, due, clock + horizon * interval '1 second');
    END IF;
    RETURN NEXT;
END
$$;
