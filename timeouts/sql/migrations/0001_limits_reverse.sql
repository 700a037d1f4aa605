DROP FUNCTION IF EXISTS timeouts_concurrency_part(integer, double precision, integer, integer);
DROP FUNCTION IF EXISTS timeouts_rate_part(double precision, double precision, integer);
DROP INDEX IF EXISTS timeouts_task_due_by_type;
DROP TABLE IF EXISTS timeouts_limits;
