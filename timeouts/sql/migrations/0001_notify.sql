-- Wake sleeping dispatchers when a task becomes due sooner than they know of.
--
-- Called inside the writing transaction, so NOTIFY is delivered at commit and never for a rollback.
-- Every transaction that NOTIFYs serialises on one cluster-wide lock at commit, so this notifies
-- only for deadlines within the horizon, and at most once per transaction for its earliest
-- deadline: the deadline already sent is remembered in a transaction-local setting (which a
-- rolled-back savepoint also rolls back, together with its NOTIFY). The payload is tiny: the
-- deadline as Unix epoch seconds.
CREATE FUNCTION timeouts_notify_v1(channel text, deadline timestamptz, horizon_end timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    epoch numeric := extract(epoch FROM deadline);
    sent text := current_setting('timeouts.notified_deadline', true);
BEGIN
    IF deadline IS NULL OR deadline > horizon_end THEN
        RETURN false;
    END IF;
    IF sent IS NOT NULL AND sent <> '' AND epoch >= sent::numeric THEN
        RETURN false;
    END IF;
    PERFORM pg_notify(channel, epoch::text);
    PERFORM set_config('timeouts.notified_deadline', epoch::text, true);
    RETURN true;
END
$$;
