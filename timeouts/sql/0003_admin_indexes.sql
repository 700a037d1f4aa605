-- Indexes for the operators' side (the admin, timeouts_stats, the metrics). The admin lists tasks in
-- action_time order, 100 at a time. On a partitioned table that is a Merge Append of one ordered
-- index scan per partition, and each scan must find its first match before the first row comes
-- out: a filter that an index only checks row by row would read every partition that holds no
-- match to its end. So each filter column leads an index of its own, followed by action_time.
--
-- Every index is paid for by inserts and by status changes (status updates are never HOT here):
-- two full indexes and one partial one, which only holds PENDING, CANCELLED and DEAD rows. The
-- other statuses are served without it: DISPATCHED and RUNNING by timeouts_task_lease (few rows),
-- DONE by timeouts_task_action_time over the past partitions only (a task is done only after its
-- action_time).
--
-- On a large existing table this migration builds each index on every partition while holding a
-- SHARE lock on it (writes wait): see README.md, "Operating timeouts", to build them beforehand
-- with CREATE INDEX CONCURRENTLY (IF NOT EXISTS then skips them here).

-- The changelist's order (newest first by default, both directions) and its "next hour" and
-- "today" windows.
CREATE INDEX IF NOT EXISTS timeouts_task_action_time ON timeouts_task (action_time);

-- The biz_type filter, however rare the biz_type.
CREATE INDEX IF NOT EXISTS timeouts_task_biz_type ON timeouts_task (biz_type, action_time);

-- The PENDING, CANCELLED and DEAD filters, however rare they are in a partition (PENDING tasks are
-- rare in past partitions; DEAD tasks wait for an operator and keep their partition from being dropped).
CREATE INDEX IF NOT EXISTS timeouts_task_status ON timeouts_task (status, action_time)
    WHERE status IN (:PENDING, :CANCELLED, :DEAD);
