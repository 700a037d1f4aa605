-- Limits, pauses and lateness policies per biz_type: what the handlers declare and what operators
-- override.
-- Parameters use Django's %(name)s style, so a literal percent sign is written %%.
--
-- The limits and pauses of biz_types (timeouts/limiting/controls.py), in timeouts_limits. What is in force
-- (set_limits()' values when overridden, else the handler's declared ones) is in its columns
-- rate_limit_in_force and concurrency_in_force, and max_lateness_in_force and on_late_in_force for
-- the lateness policy (sql/migrations/0001_limits.sql). A change that may let tasks be claimed
-- sooner wakes the dispatchers (with "now" as the deadline), so it applies at once.
-- A write reads the clock for the row it inserts: the upsert's update takes that reading from
-- `excluded`, and the NOTIFY's "now" is the row's modified_at.


-- name: limits_of
-- The limits in force, the pause and the lateness policy in force of one biz_type.
SELECT rate_limit_in_force AS rate_limit, concurrency_in_force AS concurrency, paused,
       max_lateness_in_force AS max_lateness, on_late_in_force AS on_late
FROM timeouts_limits
WHERE biz_type = %(biz_type)s;


-- name: declared_limits
-- The limits and lateness policy every biz_type's handler declares, as stored.
SELECT biz_type, declared_rate_limit, declared_concurrency, declared_max_lateness, declared_on_late
FROM timeouts_limits;


-- name: declare_limits
-- Stores the limits the handlers of this process declare, for many biz_types at once.
--
-- Wakes nobody: the scan that declares claims next, and a dispatcher re-reads its deadline within
-- seconds; a dispatcher starting would otherwise wake them all for nothing.
INSERT INTO timeouts_limits AS l
    (biz_type, declared_rate_limit, declared_concurrency, declared_max_lateness, declared_on_late, modified_at)
SELECT d.biz_type, d.rate_limit, d.concurrency, d.max_lateness, d.on_late, c.now
FROM unnest(%(biz_types)s::varchar[], %(rate_limits)s::float8[], %(concurrencies)s::integer[],
            %(max_latenesses)s::interval[], %(on_lates)s::varchar[])
         AS d(biz_type, rate_limit, concurrency, max_lateness, on_late),
     (SELECT clock_timestamp() AS now) AS c
ON CONFLICT (biz_type) DO UPDATE
SET declared_rate_limit = excluded.declared_rate_limit, declared_concurrency = excluded.declared_concurrency,
    declared_max_lateness = excluded.declared_max_lateness, declared_on_late = excluded.declared_on_late,
    modified_at = excluded.modified_at;


-- name: override_limits
-- Sets limits that replace a biz_type's declared ones, and wakes the dispatchers.
INSERT INTO timeouts_limits AS l
    (biz_type, declared_rate_limit, declared_concurrency, declared_max_lateness, declared_on_late, overridden,
     rate_limit, concurrency, modified_at)
VALUES (%(biz_type)s, %(declared_rate_limit)s, %(declared_concurrency)s, %(declared_max_lateness)s,
        %(declared_on_late)s, true, %(rate_limit)s, %(concurrency)s, clock_timestamp())
ON CONFLICT (biz_type) DO UPDATE
SET overridden = true, rate_limit = excluded.rate_limit, concurrency = excluded.concurrency,
    modified_at = excluded.modified_at
RETURNING timeouts_notify_v1(%(channel)s, l.modified_at, l.modified_at);


-- name: reset_limits
-- Drops a biz_type's overridden limits and lateness policy (back to the declared ones), and wakes the dispatchers.
--
-- The declared values are this process's, for a biz_type no claimer has declared yet.
INSERT INTO timeouts_limits AS l
    (biz_type, declared_rate_limit, declared_concurrency, declared_max_lateness, declared_on_late, modified_at)
VALUES (%(biz_type)s, %(declared_rate_limit)s, %(declared_concurrency)s, %(declared_max_lateness)s,
        %(declared_on_late)s, clock_timestamp())
ON CONFLICT (biz_type) DO UPDATE
SET overridden = false, rate_limit = NULL, concurrency = NULL,
    lateness_overridden = false, max_lateness = NULL, on_late = NULL, modified_at = excluded.modified_at
RETURNING timeouts_notify_v1(%(channel)s, l.modified_at, l.modified_at);


-- name: pause_biz_type
-- Pauses or resumes a biz_type; resuming wakes the dispatchers.
INSERT INTO timeouts_limits AS l
    (biz_type, declared_rate_limit, declared_concurrency, declared_max_lateness, declared_on_late, paused, modified_at)
VALUES (%(biz_type)s, %(declared_rate_limit)s, %(declared_concurrency)s, %(declared_max_lateness)s,
        %(declared_on_late)s, %(paused)s, clock_timestamp())
ON CONFLICT (biz_type) DO UPDATE
SET paused = excluded.paused, modified_at = excluded.modified_at
RETURNING CASE WHEN NOT l.paused THEN timeouts_notify_v1(%(channel)s, l.modified_at, l.modified_at) END;


-- name: override_lateness
-- Sets a lateness policy that replaces a biz_type's declared one.
--
-- Read by the worker's next start (sql/queries/attempts.sql, start_or_end_late), not by the claim:
-- it wakes nobody.
INSERT INTO timeouts_limits AS l
    (biz_type, declared_rate_limit, declared_concurrency, declared_max_lateness, declared_on_late,
     lateness_overridden, max_lateness, on_late, modified_at)
VALUES (%(biz_type)s, %(declared_rate_limit)s, %(declared_concurrency)s, %(declared_max_lateness)s,
        %(declared_on_late)s, true, %(max_lateness)s, %(on_late)s, clock_timestamp())
ON CONFLICT (biz_type) DO UPDATE
SET lateness_overridden = true, max_lateness = excluded.max_lateness, on_late = excluded.on_late,
    modified_at = excluded.modified_at;


-- name: lateness_policies
-- The lateness policy in force and the declared one of every biz_type that has a row.
SELECT biz_type, max_lateness_in_force AS max_lateness, on_late_in_force AS on_late, declared_max_lateness,
       declared_on_late, lateness_overridden
FROM timeouts_limits;
