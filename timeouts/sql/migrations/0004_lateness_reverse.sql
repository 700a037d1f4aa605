DROP INDEX IF EXISTS timeouts_task_ended_late;
ALTER TABLE timeouts_limits
    DROP COLUMN IF EXISTS on_late_in_force,
    DROP COLUMN IF EXISTS max_lateness_in_force,
    DROP COLUMN IF EXISTS on_late,
    DROP COLUMN IF EXISTS max_lateness,
    DROP COLUMN IF EXISTS lateness_overridden,
    DROP COLUMN IF EXISTS declared_on_late,
    DROP COLUMN IF EXISTS declared_max_lateness;
