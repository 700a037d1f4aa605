DROP INDEX IF EXISTS timeouts_task_due_by_type;
DROP TABLE IF EXISTS timeouts_limits;
