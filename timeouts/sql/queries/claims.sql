-- Claiming due tasks (the scan and the dispatcher), ending the PENDING ones their lateness policy
-- would end at their start, giving claims back, and recovering expired leases.
-- Parameters use Django's %(name)s style, so a literal percent sign is written %%.
--
-- "Now" is the database clock: clock_timestamp() where a statement must see the real time inside a
-- longer transaction, now() in the short claim transactions, where it also lets the planner prune
-- future partitions. A write reads clock_timestamp() in its FROM list (or in the row it inserts),
-- never in an UPDATE's SET nor in a RETURNING list, where distributed PostgreSQL (Citus) refuses
-- a volatile function outright; what else Citus would need is in docs: explanation/shards
-- (tests/unit/store/test_citus_ready.py keeps the rule).


-- part: pending_types
-- The recursive CTE `pending_types`: every biz_type with PENDING tasks, with its oldest run_at.
--
-- Read by the claim and by the dispatcher's claimable_deadline, each of which says when it needs it
-- (a condition on it that involves none of its columns: PostgreSQL then does not run it at all when
-- that is false). A loose index scan of timeouts_task_due_by_type that steps from one biz_type to
-- the next, one probe per partition each, however many tasks wait (SELECT DISTINCT would read them
-- all). Ordered by (biz_type, run_at) after a range of biz_types, each step is served by that index
-- only, whatever the statistics say. Not limited to due partitions: a condition on action_time is
-- not in the index, and would read every future task of the current partition. Its first row, ''
-- (before any biz_type), has no `oldest`. The health check's oldest_due_unpaused reads it too.
pending_types AS (
    SELECT ''::varchar AS biz_type, NULL::timestamptz AS oldest
    UNION ALL
    SELECT next.biz_type, next.run_at
    FROM pending_types AS p
    CROSS JOIN LATERAL (
        SELECT t.biz_type, t.run_at FROM timeouts_task AS t
        WHERE t.status = :PENDING AND t.biz_type > p.biz_type
        ORDER BY t.biz_type, t.run_at LIMIT 1
    ) AS next
)


-- part: oldest_due_tasks
-- A LATERAL subquery of the claim: the oldest due tasks of `w.biz_type`, at most `w.take`, locked.
--
-- The index scan's LIMIT counts only rows it could lock (SKIP LOCKED), so any number of claimers
-- take different tasks. The row comparison bounds the scan in the (biz_type, run_at) index, which
-- no other index can use: the run_at one would read the other biz_types' due tasks to find these,
-- the admin's (biz_type, action_time) one sort all of theirs. Implied by run_at >= action_time,
-- a bound on action_time is spelled out so future partitions are pruned: now() + lead (due_by's
-- value), pruned when the claim starts (claim_due says why never as it runs).
SELECT t.job_id, t.action_time, t.tableoid, t.ctid, t.run_at
FROM timeouts_task AS t
WHERE t.status = :PENDING AND t.biz_type = w.biz_type
  AND (t.biz_type, t.run_at) <= (w.biz_type, (SELECT due_by FROM clock))
  AND t.action_time <= now() + %(lead)s * interval '1 second'
ORDER BY t.run_at
LIMIT w.take
FOR UPDATE SKIP LOCKED


-- name: claim_due
-- Claims the due tasks, shared fairly among biz_types within their limits, and leases them.
--
-- The one claim used by the scan and by the dispatcher: due tasks (or due within `lead` seconds),
-- shared fairly among the biz_types that have any, oldest first within each, within the limits
-- and pauses of timeouts_limits, skipping rows another claimer or a cancel holds. A claim takes a
-- lease of the task's TTR; attempts is counted when the handler starts, not here.
--
-- The scans that choose tasks bound run_at by `clock.due_by`, a value the planner cannot see (an
-- InitPlan), rather than by now() + %(lead)s: their plans then do not depend on the parameters or
-- the clock, and PostgreSQL keeps the generic plan of the prepared claim instead of planning it
-- again for every claim (a cost that grows with its partitions times its references to the table).
-- Every scan prunes future partitions with now() + %(lead)s when the claim starts, which also
-- spares setting up their scans. Only the UPDATE prunes as it runs (to the one partition of each
-- row), and it is the statement itself, not a WITH query: when a locking scan finds a row that
-- another claimer took since this statement's snapshot, PostgreSQL 18 sets up that scan and every
-- WITH query again for its recheck of the row (EvalPlanQual), sharing their run-time pruning state
-- with the statement, and leaves that state in the recheck's freed memory. The next recheck or
-- run-time pruning then crashes the server (SIGSEGV, or "pfree called with invalid pointer", seen
-- on 18.6) or prunes the wrong partitions (a chosen row left unclaimed). The UPDATE changes only
-- rows this statement locked, so it never rechecks one itself.
-- Estimated with defaults, the plan is kept to shapes that read what they return whatever the
-- estimates: LATERAL index scans with LIMIT, and the UPDATE's rows found by ctid. The LIMIT 5000
-- of the two rounds never cuts a claim (claiming.MAX_CLAIM) but caps their estimates, whose cost
-- would otherwise grow with the table and cross jit_above_cost (JIT compiling this plan would cost
-- far more than the claim).
WITH RECURSIVE
clock AS (
    SELECT now() + %(lead)s * interval '1 second' AS due_by
),
-- Backpressure, so a backlog waits here and not in the broker (where leases would expire and the
-- tasks be published again): no claims while a batch's worth (or half of max_dispatched, if less:
-- only that many are counted) of claimed tasks have waited more than half their TTR for a worker
-- (the workers are saturated; a few lost messages are not a backlog,
-- and expired leases are lease recovery's business), and never more than max_dispatched claimed
-- but not started (two claimers at once may overshoot by a batch). One index scan serves both: the
-- lease index returns the oldest claims first.
dispatched AS (
    SELECT count(*) AS n,
           count(*) FILTER (WHERE lease_until > now() AND lease_until < now() + ttr * interval '0.5 second')
               >= least(%(limit)s, greatest(1, %(max_dispatched)s / 2)) AS saturated
    FROM (
        SELECT lease_until, ttr FROM timeouts_task
        -- A claimed task was due when claimed: no future partition can hold one.
        WHERE status = :DISPATCHED AND action_time <= now() + %(lead)s * interval '1 second'
        LIMIT %(max_dispatched)s
    ) AS capped
),
budget AS (
    SELECT CASE WHEN saturated THEN 0 ELSE greatest(0, least(%(limit)s, %(max_dispatched)s - n)) END AS n
    FROM dispatched
),
{pending_types},
-- Those with a due task, when the claim may take any.
due_types AS (
    SELECT biz_type, oldest FROM pending_types
    WHERE oldest <= (SELECT due_by FROM clock) AND (SELECT n FROM budget) > 0
),
-- The limits in force of the due biz_types (timeouts_limits; isolation.py), as this statement's
-- snapshot sees them, then the rows of the limited ones locked, skipping a row another claimer
-- holds: that claimer is serving that biz_type, this one leaves it alone for this round. Every
-- claim of a limited biz_type updates its row (`spent`), so a row whose version changed since
-- the snapshot (`current` false) was claimed from after this snapshot, whose counts of running
-- tasks are then stale: that biz_type is left alone too. So claims of a limited biz_type follow
-- one another, each seeing every claim before it, however many claimers run. On one of several
-- shards, this shard's part of each limit (sql/migrations/0001_limits.sql): the claims of every
-- shard together stay within the deployment's limit. Each limit is read as within the bounds the
-- API accepts (the functions see to it), as claimable_deadline reads them.
seen AS MATERIALIZED (
    SELECT l.biz_type, l.xmin AS version, l.paused,
           timeouts_rate_part(l.rate_limit_in_force, l.rate_share, %(shard_count)s::integer) AS rate_limit,
           timeouts_concurrency_part(l.concurrency_in_force, l.concurrency_share, %(shard_index)s::integer,
                                     %(shard_count)s::integer) AS concurrency
    FROM timeouts_limits AS l JOIN due_types USING (biz_type)
),
limited AS (
    SELECT * FROM seen WHERE paused OR rate_limit IS NOT NULL OR concurrency IS NOT NULL
),
locked AS (
    SELECT l.biz_type, l.xmin = limited.version AS current, l.tokens, l.refilled_at
    FROM timeouts_limits AS l JOIN limited USING (biz_type)
    WHERE NOT limited.paused
    FOR UPDATE OF l SKIP LOCKED
),
-- Claimed or running, whatever their lease: a lost worker's task holds its slot until lease
-- recovery gives it back (the scan's first step), a handler that outlives its lease until it ends.
-- Counted for every biz_type, from the lease index (a condition on biz_type would let the admin's
-- (biz_type, action_time) index read every finished task of the biz_type), and only when a due
-- biz_type has a concurrency limit.
in_flight AS (
    SELECT biz_type, count(*) AS n FROM timeouts_task
    WHERE status IN (:DISPATCHED, :RUNNING) AND action_time <= now() + %(lead)s * interval '1 second'
      AND EXISTS (SELECT FROM limited WHERE concurrency IS NOT NULL)
    GROUP BY biz_type
),
-- How many each due biz_type may have now (NULL: no limit): what its rate limit's token bucket
-- holds (`available`, sql/migrations/0001_limits.sql), within what its concurrency limit leaves.
-- The bucket's clock is due_by, as for the tasks: a dispatcher claims a lead ahead what falls due
-- within the lead, a claim included; and it never runs backwards (`spent`), so claimers with
-- different leads are never given a claim twice.
allowed AS (
    SELECT d.biz_type, d.oldest, b.available,
        CASE WHEN limited.biz_type IS NULL THEN NULL
             WHEN locked.current IS NOT TRUE THEN 0  -- paused, held by another claimer, or stale
             ELSE greatest(0, least(floor(b.available), limited.concurrency - coalesce(in_flight.n, 0)))
        END AS n
    FROM due_types AS d
    LEFT JOIN limited USING (biz_type)
    LEFT JOIN locked USING (biz_type)
    LEFT JOIN in_flight USING (biz_type)
    CROSS JOIN LATERAL (
        SELECT timeouts_bucket_tokens(limited.rate_limit, locked.tokens, locked.refilled_at,
                                      (SELECT due_by FROM clock)) AS available
    ) AS b
),
-- The claim shared equally among the biz_types that may have any, the remainder to the ones
-- whose oldest due task is oldest (so with more biz_types than the claim's size, the longest
-- waiting ones first), each share within its biz_type's limits.
shares AS (
    SELECT a.*, q.share
    FROM (SELECT allowed.*, row_number() OVER (ORDER BY oldest, biz_type) AS rank, count(*) OVER () AS types
          FROM allowed WHERE n IS DISTINCT FROM 0) AS a,
         budget,
         LATERAL (SELECT least(a.n, budget.n / a.types
                                    + CASE WHEN a.rank <= budget.n %% a.types THEN 1 ELSE 0 END) AS share) AS q
),
-- Each share, oldest first (oldest_due_tasks, above).
first_round AS (
    SELECT w.biz_type, c.*
    FROM (SELECT biz_type, share AS take FROM shares WHERE share > 0) AS w
    CROSS JOIN LATERAL (
        {oldest_due_tasks}
    ) AS c
    LIMIT 5000
),
-- What the biz_types that had fewer due tasks than their share left, shared among those that
-- filled theirs (and may have more): a backlog still fills the claim, after everyone's share.
-- Their scans start again from their oldest task: the rows of the first round are this
-- transaction's own locks, which SKIP LOCKED does not skip, and UNION counts once.
taken AS (
    SELECT s.*, coalesce(f.n, 0) AS got
    FROM shares AS s
    LEFT JOIN (SELECT biz_type, count(*) AS n FROM first_round GROUP BY biz_type) AS f USING (biz_type)
),
hungry AS (
    SELECT h.*, q.extra
    FROM (SELECT w.*, row_number() OVER (ORDER BY w.rank) AS rank2, count(*) OVER () AS types2
          FROM (SELECT taken.*, (SELECT budget.n FROM budget) - sum(got) OVER () AS shortfall FROM taken) AS w
          WHERE w.got = w.share AND w.share > 0 AND w.share IS DISTINCT FROM w.n) AS h,
         LATERAL (SELECT least(h.n - h.share, h.shortfall / h.types2
                               + CASE WHEN h.rank2 <= h.shortfall %% h.types2 THEN 1 ELSE 0 END) AS extra) AS q
),
second_round AS (
    SELECT w.biz_type, c.*
    FROM (SELECT biz_type, share + extra AS take FROM hungry WHERE extra > 0) AS w
    CROSS JOIN LATERAL (
        {oldest_due_tasks}
    ) AS c
    LIMIT 5000
),
-- At most each biz_type's allowance and the budget, round by round: every biz_type's first task,
-- then every second one, and so on.
chosen AS (
    SELECT c.*
    FROM (SELECT u.*, row_number() OVER (PARTITION BY u.biz_type ORDER BY u.run_at) AS nth
          FROM (SELECT * FROM first_round UNION SELECT * FROM second_round) AS u) AS c
    JOIN shares AS s USING (biz_type)
    WHERE c.nth <= coalesce(s.n, c.nth)
    ORDER BY c.nth, s.rank
    LIMIT (SELECT n FROM budget)
),
-- The limited biz_types' rows: what their claims used of the bucket, and a new row version, which
-- tells a claimer whose snapshot is older that its counts are stale. Counted from `chosen`: the
-- UPDATE below is the statement itself, whose rows no WITH query can read (so that it prunes as it
-- runs outside them, see above). A chosen row that the UPDATE does not find again (changed since
-- the snapshot, and still due) is counted too: its biz_type's bucket gives one claim fewer.
spent AS (
    UPDATE timeouts_limits AS l
    SET tokens = greatest(0, coalesce(a.available, 0) - c.n),
        refilled_at = greatest(l.refilled_at, (SELECT due_by FROM clock))
    FROM (SELECT biz_type, count(*) AS n FROM chosen GROUP BY biz_type) AS c
    JOIN allowed AS a USING (biz_type)
    WHERE l.biz_type = c.biz_type AND a.n IS NOT NULL
)
UPDATE timeouts_task AS t
SET status = :DISPATCHED, dispatched_at = now(), modified_at = now(),
    lease_until = now() + t.ttr * interval '1 second'
FROM chosen AS due
-- Each row is found again where it was locked (it cannot move while locked): its partition,
-- then its ctid, by a TID scan of the chosen ctids. Joined by key alone, a partition whose
-- statistics predate a burst scheduled into it is searched through the admin's (action_time)
-- index, which then reads every task due at that instant for each one claimed; and a generic
-- plan may hash every due row of the partition. A row that another transaction changed after
-- this statement's snapshot is not found again here: it stays PENDING, and the next claim
-- takes it.
WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM chosen))
  AND t.tableoid = due.tableoid AND t.ctid = due.ctid AND t.job_id = due.job_id
  AND t.action_time = due.action_time
  -- Repeated for the UPDATE's own scan, so it too skips future partitions.
  AND t.action_time <= now() + %(lead)s * interval '1 second'
-- The partition that holds the row: the worker's start and DONE run on it (queries.py, ON_PARTITION).
-- A task of a kind whose claims come with their attribute (timeouts/registry.py: a stored Celery call,
-- the call its message is made of) has it here: its biz_type starts with one of
-- the parameter attribute_prefixes (`^@`: starts with); a handler's task, without.
-- biz_id and trace_context (NULL unless scheduled inside a span): for the dispatch's span (tracing.py).
RETURNING t.job_id, t.action_time, t.run_at, t.biz_type, t.attempts, t.ttr, now() AS claimed_at,
          t.tableoid::regclass::text AS partition,
          CASE WHEN t.biz_type ^@ ANY (%(attribute_prefixes)s::text[]) THEN t.attribute END AS call,
          t.biz_id, t.trace_context;


-- part: smallest_late_policy
-- A scalar subquery: the smallest max_lateness (seconds) of the policies that end late tasks, if any.
--
-- Of the policies in force with on_late "skip" or "dead", as the start reads them
-- (start_or_end_late, sql/queries/attempts.sql): the handlers' own as the claimers declare them,
-- or set_limits()' overrides. NULL when no biz_type that is not paused has such a policy: then
-- end_late_pending is not run at all. One read of the tiny limits table.
(SELECT extract(epoch FROM min(max_lateness_in_force))::float8 FROM timeouts_limits
 WHERE on_late_in_force IN ('skip', 'dead') AND NOT paused)


-- name: late_policies
-- The smallest max_lateness of the policies that end late tasks (on_late "skip" or "dead"), if any.
SELECT
    {smallest_late_policy} AS min_lateness;


-- name: end_late_pending
-- Ends PENDING tasks already later than their lateness policy allows, without claiming them.
--
-- A PENDING task whose run_at is more than its biz_type's max_lateness ago (on_late "skip" or
-- "dead") would be ended by its start (start_or_end_late) however soon it is claimed: it ends
-- here instead, CANCELLED or DEAD, with the start's last_error, and never travels to a worker.
-- The start's rules hold: lateness counts from run_at, by the database clock; a task whose
-- last_error says a late start ended it was requeued since, and is left to run however late.
-- Only the oldest `limit` of each such biz_type, through timeouts_task_due_by_type, skipping rows
-- a claimer or a cancel holds (a cancel that returned true has ended the row first; one that comes
-- after finds it ended). `min_lateness` (late_policies) bounds action_time (never after run_at),
-- so that only partitions at least that old are read: pruned when the statement starts, as the
-- claim's scans are (claim_due says why never as it runs). Found again by ctid, as in claim_due.
-- A paused biz_type is left alone, as the claim leaves it. Ending a task makes nothing due sooner:
-- no NOTIFY.
WITH policies AS MATERIALIZED (
    SELECT l.biz_type, l.max_lateness_in_force AS max_lateness, l.on_late_in_force AS on_late
    FROM timeouts_limits AS l
    WHERE l.on_late_in_force IN ('skip', 'dead') AND NOT l.paused
),
late AS (
    SELECT p.on_late, p.max_lateness, t.job_id, t.action_time, t.tableoid, t.ctid
    FROM policies AS p
    CROSS JOIN LATERAL (
        SELECT t.job_id, t.action_time, t.tableoid, t.ctid FROM timeouts_task AS t
        WHERE t.status = :PENDING AND t.biz_type = p.biz_type
          AND (t.biz_type, t.run_at) < (p.biz_type, now() - p.max_lateness)
          AND t.action_time < now() - %(min_lateness)s * interval '1 second'
          AND NOT starts_with(t.last_error, 'not run: started ')
        ORDER BY t.run_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS t
    LIMIT %(limit)s
)
UPDATE timeouts_task AS t
SET status = CASE late.on_late WHEN 'skip' THEN :CANCELLED ELSE :DEAD END,
    finished_at = now(), modified_at = now(),
    last_error = format('not run: started %%s s after its time, over max_lateness %%s s (on_late=%%s)',
                        round(extract(epoch FROM now() - t.run_at), 1),
                        trim_scale(extract(epoch FROM late.max_lateness)), late.on_late)
FROM late
WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM late))
  AND t.tableoid = late.tableoid AND t.ctid = late.ctid AND t.job_id = late.job_id
  AND t.action_time = late.action_time
  AND t.action_time < now() - %(min_lateness)s * interval '1 second'
RETURNING t.job_id, t.biz_type, late.on_late, extract(epoch FROM now() - t.run_at)::float8 AS lateness;


-- name: release_claims
-- Give back claims whose message was never published, without waiting for their lease.
UPDATE timeouts_task AS t
SET status = :PENDING, lease_until = NULL, modified_at = c.now
FROM unnest(%(job_ids)s::bigint[], %(action_times)s::timestamptz[]) AS r(job_id, action_time),
     (SELECT clock_timestamp() AS now) AS c
WHERE t.job_id = r.job_id AND t.action_time = r.action_time AND t.status = :DISPATCHED
RETURNING timeouts_notify_v1(%(channel)s, t.run_at, c.now + %(horizon)s * interval '1 second');


-- name: claim_oldest_due
-- Claims the oldest PENDING task due by a given time, to run it in the calling process (timeouts.testing).
--
-- For run_due(), on the caller's connection and in its transaction: one task at a time, so that a
-- task the runs schedule takes its turn, oldest first on this shard. Due by `until`; or, given
-- `since`, scheduled since then to be due at once (what a run schedules for now: a retry is due
-- after its backoff, later than it was scheduled). Of one biz_type, if given. A paused biz_type's
-- tasks stay PENDING; rate and concurrency limits do not apply, as the tasks run one after another.
-- The lease is as claim_due takes it. A task due after the database clock (an `until` ahead of it)
-- keeps its run_at, which is never before its action_time: the caller records its start ahead.
UPDATE timeouts_task AS t
SET status = :DISPATCHED, dispatched_at = c.now, modified_at = c.now, lease_until = c.now + t.ttr * interval '1 second'
FROM (SELECT clock_timestamp() AS now) AS c,
     (SELECT d.job_id, d.action_time FROM timeouts_task AS d
      WHERE d.status = :PENDING
        AND (d.run_at <= %(until)s OR (d.created_at >= %(since)s AND d.run_at <= d.created_at))
        AND (%(biz_type)s::text IS NULL OR d.biz_type = %(biz_type)s)
        AND NOT EXISTS (SELECT FROM timeouts_limits AS l WHERE l.biz_type = d.biz_type AND l.paused)
      ORDER BY d.run_at, d.job_id
      LIMIT 1
      FOR UPDATE SKIP LOCKED) AS due
WHERE t.job_id = due.job_id AND t.action_time = due.action_time
RETURNING t.job_id, t.action_time, t.run_at, t.biz_type, t.attempts, t.ttr, c.now AS claimed_at,
          t.tableoid::regclass::text AS partition, t.attribute;


-- name: end_claim
-- Ends a claimed Celery call that is not published: CANCELLED (expired) or DEAD.
--
-- A claimed call that is not published, and says why: CANCELLED when its Celery `expires` has
-- passed, DEAD when its message cannot be made (an operator may requeue it once that is fixed).
UPDATE timeouts_task
SET status = %(status)s, finished_at = c.now, modified_at = c.now, lease_until = NULL, last_error = %(error)s
FROM (SELECT clock_timestamp() AS now) AS c
WHERE job_id = %(job_id)s AND action_time = %(action_time)s AND status = :DISPATCHED
  AND %(status)s IN (:CANCELLED, :DEAD)
RETURNING job_id;


-- name: recover_expired
-- Takes back claims and runs whose lease ran out: to PENDING, or DEAD if out of attempts.
--
-- Claims and runs whose lease ran out: the publisher or the worker died, or the handler overran
-- its TTR. A claim that never started goes back to PENDING as it was; a started one has used its
-- attempt, and becomes DEAD if it was the last.
WITH expired AS (
    SELECT job_id, action_time
    FROM timeouts_task
    WHERE status IN (:DISPATCHED, :RUNNING) AND lease_until < clock_timestamp()
    ORDER BY lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE timeouts_task AS t
SET status = CASE WHEN t.status = :RUNNING AND t.attempts >= t.max_attempts THEN :DEAD ELSE :PENDING END,
    finished_at = CASE WHEN t.status = :RUNNING AND t.attempts >= t.max_attempts THEN c.now END,
    last_error = CASE WHEN t.status = :RUNNING
        THEN format('attempt %%s: lease of %%s s expired while running (worker lost, or the handler ran longer than its TTR)', t.attempts, t.ttr)
        ELSE t.last_error END,
    lease_until = NULL, modified_at = c.now
FROM expired, (SELECT clock_timestamp() AS now) AS c
WHERE t.job_id = expired.job_id AND t.action_time = expired.action_time
RETURNING t.job_id, t.status, t.biz_type, timeouts_notify_v1(%(channel)s, CASE WHEN t.status = :PENDING THEN t.run_at END, c.now) AS notified;
