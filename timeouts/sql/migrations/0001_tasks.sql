-- The task table, partitioned by action_time: each partition is one bucket of the time wheel.
-- The database key is (job_id, action_time) because a partitioned table's unique constraints must
-- include the partition key; job_id alone is unique by construction (one sequence).

CREATE SEQUENCE timeouts_task_job_id_seq AS bigint;

CREATE TABLE timeouts_task (
    job_id        bigint       NOT NULL DEFAULT nextval('timeouts_task_job_id_seq'),
    biz_type      varchar(64)  NOT NULL,
    biz_id        varchar(255) NOT NULL,
    status        smallint     NOT NULL DEFAULT :PENDING,
    action_time   timestamptz  NOT NULL,
    -- When the next attempt may start: action_time at first, later than that after a retry.
    run_at        timestamptz  NOT NULL,
    attribute     jsonb        NOT NULL DEFAULT '{}',
    attempts      integer      NOT NULL DEFAULT 0,
    max_attempts  integer      NOT NULL,
    ttr           integer      NOT NULL,
    last_error    text         NOT NULL DEFAULT '',
    lease_until   timestamptz,
    created_at    timestamptz  NOT NULL DEFAULT clock_timestamp(),
    modified_at   timestamptz  NOT NULL DEFAULT clock_timestamp(),
    dispatched_at timestamptz,
    started_at    timestamptz,
    finished_at   timestamptz,
    -- Where a task of Django's tasks framework (timeouts.backends.TimeoutsBackend) keeps its
    -- result; other tasks leave them NULL. The model does not declare them: the admin and the ORM
    -- never read them, so listing tasks does not fetch them; the backend reads them by primary key.
    -- The JSON the task's function returned (JSON null for None); NULL until it returned.
    return_value  jsonb,
    -- [{"exception_class_path": ..., "traceback": ...}, ...]: one entry per failed attempt.
    errors        jsonb,
    -- The worker that started each attempt, in order.
    worker_ids    text[],
    -- The trace context of the code that scheduled the task (timeouts/tracing.py): with
    -- OpenTelemetry installed and a span active, schedule(), bulk_schedule(), a DurableTask call
    -- with an eta and a task of Django's tasks framework store the W3C traceparent, then a space and
    -- the tracestate if any; NULL otherwise. The claim and the worker's start return it, and the
    -- dispatch and each attempt's run are spans linked to it. Not in the model either: only
    -- timeouts' own statements read it.
    trace_context text,
    PRIMARY KEY (job_id, action_time),
    CONSTRAINT timeouts_task_biz_type_valid CHECK (biz_type ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    CONSTRAINT timeouts_task_biz_id_valid CHECK (length(biz_id) BETWEEN 1 AND 255),
    -- 0 PENDING, 1 DISPATCHED, 2 DONE, 3 CANCELLED, 4 RUNNING, 5 DEAD
    CONSTRAINT timeouts_task_status_valid CHECK (status BETWEEN :PENDING AND :DEAD),
    CONSTRAINT timeouts_task_attribute_object CHECK (jsonb_typeof(attribute) = 'object'),
    CONSTRAINT timeouts_task_attempts_valid
        CHECK (attempts >= 0 AND max_attempts >= 1 AND attempts <= max_attempts),
    CONSTRAINT timeouts_task_ttr_positive CHECK (ttr >= 1),
    CONSTRAINT timeouts_task_never_early CHECK (run_at >= action_time),
    -- Exactly the claimed (DISPATCHED) and started (RUNNING) tasks hold a lease.
    CONSTRAINT timeouts_task_lease_iff_claimed CHECK ((status IN (:DISPATCHED, :RUNNING)) = (lease_until IS NOT NULL)),
    CONSTRAINT timeouts_task_dispatched_has_time CHECK (status <> :DISPATCHED OR dispatched_at IS NOT NULL),
    CONSTRAINT timeouts_task_started_has_time CHECK (status NOT IN (:DONE, :RUNNING) OR started_at IS NOT NULL),
    CONSTRAINT timeouts_task_finished_iff_final CHECK ((status IN (:DONE, :CANCELLED, :DEAD)) = (finished_at IS NOT NULL))
) PARTITION BY RANGE (action_time);

ALTER SEQUENCE timeouts_task_job_id_seq OWNED BY timeouts_task.job_id;

-- Rows outside every partition land here, so an insert is never refused. Maintenance moves them
-- into a partition when one is created for their range.
CREATE TABLE timeouts_task_default PARTITION OF timeouts_task DEFAULT;

-- What is due: the scan and the dispatcher walk this in run_at order. Partial, so it only holds
-- waiting tasks and stays small however many finished rows a partition keeps.
CREATE INDEX timeouts_task_due ON timeouts_task (run_at) WHERE status = :PENDING;

-- Lease recovery: claimed or running tasks whose lease ran out.
CREATE INDEX timeouts_task_lease ON timeouts_task (lease_until) WHERE status IN (:DISPATCHED, :RUNNING);

-- Cancel by business key, on_conflict, and the admin's search by biz_id.
CREATE INDEX timeouts_task_biz ON timeouts_task (biz_id, biz_type);

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

-- The changelist's order (newest first by default, both directions) and its "next hour" and
-- "today" windows.
CREATE INDEX timeouts_task_action_time ON timeouts_task (action_time);

-- The biz_type filter, however rare the biz_type.
CREATE INDEX timeouts_task_biz_type ON timeouts_task (biz_type, action_time);

-- The PENDING, CANCELLED and DEAD filters, however rare they are in a partition (PENDING tasks are
-- rare in past partitions; DEAD tasks wait for an operator and keep their partition from being dropped).
CREATE INDEX timeouts_task_status ON timeouts_task (status, action_time)
    WHERE status IN (:PENDING, :CANCELLED, :DEAD);

-- The admin's "ended late" filter (timeouts/admin/filters.py): the tasks that a late start ended
-- (timeouts/limiting/lateness.py), newest first. Partial, so it holds those tasks alone: the writes
-- of every other task pay only the check of its condition (a status change is never a HOT update
-- anyway). Without it the filter would read every cancelled task of the past partitions to find a
-- few.
CREATE INDEX timeouts_task_ended_late ON timeouts_task (status, action_time)
    WHERE status IN (:CANCELLED, :DEAD) AND last_error LIKE 'not run: started %';
