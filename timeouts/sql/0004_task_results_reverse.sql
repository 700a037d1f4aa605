ALTER TABLE timeouts_task
    DROP COLUMN IF EXISTS worker_ids,
    DROP COLUMN IF EXISTS errors,
    DROP COLUMN IF EXISTS return_value;
