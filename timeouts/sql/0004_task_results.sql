-- Where a task of Django's tasks framework (timeouts.backends.TimeoutsBackend) keeps its result:
-- the value its function returned, the error of each failed attempt, and the worker of each
-- attempt. Other tasks leave them NULL.
--
-- Nullable columns without a default: PostgreSQL only records them in the catalog, on the
-- partitioned table and every partition at once, and rewrites no row, so this is as quick on
-- 2 x 10^7 rows as on none. It still takes an ACCESS EXCLUSIVE lock on each partition for that
-- moment: behind a long-running transaction it waits, and claims queue behind it.
--
-- The model does not declare them: the admin and the ORM never read them, so listing tasks costs
-- what it cost before; the backend reads them by primary key, one row at a time.

ALTER TABLE timeouts_task
    -- The JSON the task's function returned (JSON null for None); NULL until it returned.
    ADD COLUMN IF NOT EXISTS return_value jsonb,
    -- [{"exception_class_path": ..., "traceback": ...}, ...]: one entry per failed attempt.
    ADD COLUMN IF NOT EXISTS errors jsonb,
    -- The worker that started each attempt, in order.
    ADD COLUMN IF NOT EXISTS worker_ids text[];
