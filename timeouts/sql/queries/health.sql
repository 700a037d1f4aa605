-- The health check's own reads (timeouts/stats/health.py); it also reads stats.sql's oldest_overdue,
-- last_claims.sql and partitions.sql.
-- Parameters use Django's %(name)s style, so a literal percent sign is written %%.


-- name: oldest_due_unpaused
-- The PENDING task due longest among the biz_types that are not paused, with how long it has waited.
--
-- Read when the oldest overdue task (oldest_overdue) is of a paused biz_type, whose tasks wait on
-- purpose. The biz_types with PENDING tasks, and the oldest run_at of each, are stepped through as
-- the claim does (one probe per partition each, however long a paused backlog is); the oldest due
-- of the others is then read off the same index. run_at >= action_time: the bound on action_time
-- lets PostgreSQL skip the partitions that cannot hold it.
WITH RECURSIVE
{pending_types}
SELECT t.job_id, t.biz_type, t.biz_id, t.action_time, t.run_at, t.attempts, now() - t.run_at AS age
FROM (
    SELECT p.biz_type, p.oldest FROM pending_types AS p
    WHERE p.oldest <= now()
      AND NOT EXISTS (SELECT FROM timeouts_limits AS l WHERE l.biz_type = p.biz_type AND l.paused)
    ORDER BY p.oldest
    LIMIT 1
) AS w
CROSS JOIN LATERAL (
    SELECT t.job_id, t.biz_type, t.biz_id, t.action_time, t.run_at, t.attempts FROM timeouts_task AS t
    WHERE t.status = :PENDING AND t.biz_type = w.biz_type AND t.run_at = w.oldest AND t.action_time <= w.oldest
    LIMIT 1
) AS t;
