DROP INDEX IF EXISTS timeouts_task_status;
DROP INDEX IF EXISTS timeouts_task_biz_type;
DROP INDEX IF EXISTS timeouts_task_action_time;
