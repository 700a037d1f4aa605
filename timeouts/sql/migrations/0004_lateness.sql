-- The lateness policy of biz_types (timeouts/lateness.py): how late an attempt may start, and what
-- becomes of one that starts later. Kept beside the limits, as they are: what the handler declares
-- (@timeouts.handler(max_lateness=, on_late=)), what set_limits() overrides, and what is in force.
-- The worker's compare-and-set (start_task, sql/queries/attempts.sql) reads the two columns in
-- force, in the statement that starts the attempt.
ALTER TABLE timeouts_limits
    -- What the handler declares; the claimers write the values of the code they run (declare()).
    -- NULL max_lateness: no limit.
    ADD COLUMN declared_max_lateness interval,
    ADD COLUMN declared_on_late      varchar(4) NOT NULL DEFAULT 'run',
    -- set_limits(max_lateness=, on_late=): these replace the declared values until reset_limits().
    -- Apart from the limits' own `overridden`: changing one does not change the other.
    ADD COLUMN lateness_overridden   boolean    NOT NULL DEFAULT false,
    ADD COLUMN max_lateness          interval,
    ADD COLUMN on_late               varchar(4),
    ADD CONSTRAINT timeouts_limits_max_lateness_valid CHECK (
        (declared_max_lateness > interval '0') IS NOT FALSE AND (max_lateness > interval '0') IS NOT FALSE),
    ADD CONSTRAINT timeouts_limits_on_late_valid CHECK (
        declared_on_late IN ('run', 'skip', 'dead') AND (on_late IN ('run', 'skip', 'dead')) IS NOT FALSE),
    -- Skipping or making dead what is late needs to know how late is too late.
    ADD CONSTRAINT timeouts_limits_on_late_needs_max_lateness CHECK (
        (declared_on_late = 'run' OR declared_max_lateness IS NOT NULL)
        AND (on_late = 'run' OR max_lateness IS NOT NULL) IS NOT FALSE),
    ADD CONSTRAINT timeouts_limits_lateness_override_only_when_overridden CHECK (
        CASE WHEN lateness_overridden THEN on_late IS NOT NULL ELSE on_late IS NULL AND max_lateness IS NULL END);

-- The policy in force, kept by PostgreSQL as the limits in force are (0001_limits.sql): the
-- override when set_limits() made one, else what the handler declares.
ALTER TABLE timeouts_limits
    ADD COLUMN max_lateness_in_force interval
        GENERATED ALWAYS AS (CASE WHEN lateness_overridden THEN max_lateness ELSE declared_max_lateness END) STORED,
    ADD COLUMN on_late_in_force      varchar(4)
        GENERATED ALWAYS AS (CASE WHEN lateness_overridden THEN on_late ELSE declared_on_late END) STORED;

-- The admin's "ended late" filter (timeouts/admin/filters.py): the tasks that a late start ended,
-- newest first. Partial, so it holds those tasks alone: the writes of every other task pay only
-- the check of its condition (a status change is never a HOT update anyway). Without it the filter
-- would read every cancelled task of the past partitions to find a few.
CREATE INDEX timeouts_task_ended_late ON timeouts_task (status, action_time)
    WHERE status IN (:CANCELLED, :DEAD) AND last_error LIKE 'not run: started %';
