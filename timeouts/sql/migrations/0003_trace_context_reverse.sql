SET LOCAL lock_timeout = '10s';
ALTER TABLE timeouts_task DROP COLUMN IF EXISTS trace_context;
