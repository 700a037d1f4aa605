-- schedule(..., on_conflict="debounce"): move a key's PENDING task to its new time and attribute,
-- capped at its first scheduling plus max_wait, in one round trip.
--
-- Race-free under READ COMMITTED because of the order of its statements. It first takes the key's
-- advisory locks as lock_biz_key does (its bucket's, shared, then its own), so every caller of one
-- key with an on_conflict, whatever its mode, comes after the one before it has committed. Then,
-- since a VOLATILE PL/pgSQL function gives each statement a snapshot of its own, the read of the
-- key's PENDING task sees whatever the previous holder of the lock committed: a task it created,
-- or moved. (One SQL statement could not do this: its snapshot would be taken before it waited for
-- the lock.) The clock is read after the lock too, so of two calls with the same delay the later
-- one sets the later time.
--
-- The row lock orders the move against the claim (UPDATE ... FOR UPDATE SKIP LOCKED, PENDING to
-- DISPATCHED): a claim that locked the task first commits first, the read then finds the task
-- DISPATCHED, passes it over, and the caller creates a new task, while the claimed one runs at its
-- time; a move that locked it first commits first, and a claim skips it or, re-reading it, finds it
-- due later. A task already claimed is never moved: its message may be on its way to a worker.
--
-- Returns one row: `task`, the task as moved, or NULL when the key has no PENDING task, for the
-- caller to insert one (through insert_task, in the same transaction, under the lock this took);
-- and `due`, the time this call gives the task: `at`, or the clock plus `delay`, but never later
-- than the first scheduling plus `max_wait` (NULL: no cap), where the first scheduling is the
-- creation of the PENDING task that is moved, or now for a task to create. A time in the past
-- makes the task due at once, never early: the claim and the worker compare run_at with the clock.
-- Only a task moved earlier than it was due wakes the dispatchers (timeouts_notify_v1, within the
-- horizon): a later deadline they learn when they next read the nearest one.
CREATE FUNCTION timeouts_debounce_v1(
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
    -- beside it with on_conflict=None may be PENDING too.
    SELECT t.job_id, t.action_time, t.run_at, t.created_at INTO waiting
    FROM timeouts_task AS t
    WHERE t.biz_id = key_id AND t.biz_type = key_type AND t.status = :PENDING
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
