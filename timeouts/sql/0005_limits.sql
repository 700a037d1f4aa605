-- Business isolation: the limits and pauses of biz_types, and the index fair claiming walks.

-- One row per biz_type that has limits, a pause, or a handler that declares limits. Small and
-- unpartitioned: the claim reads it (and locks the rows of the limited biz_types it claims), the
-- limits functions (timeouts/isolation.py) write it. What is in force for a biz_type:
-- rate_limit and concurrency when overridden, else the declared ones; NULL means no limit.
CREATE TABLE IF NOT EXISTS timeouts_limits (
    biz_type             varchar(64)      PRIMARY KEY,
    -- What the handler declares (@timeouts.handler(rate_limit=, concurrency=)): the claimers write
    -- the values of the code they run (isolation.declare()).
    declared_rate_limit  double precision,
    declared_concurrency integer,
    -- set_limits(): these replace the declared values until reset_limits().
    overridden           boolean          NOT NULL DEFAULT false,
    rate_limit           double precision,
    concurrency          integer,
    -- pause(): no task of this biz_type is claimed until resume().
    paused               boolean          NOT NULL DEFAULT false,
    -- The rate limit's token bucket, kept by the claim: `tokens` claims were allowed at
    -- `refilled_at` (database clock), and it refills at the rate, up to one second's worth (and
    -- at least one). NULL refilled_at: full.
    tokens               double precision NOT NULL DEFAULT 0,
    refilled_at          timestamptz,
    modified_at          timestamptz      NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT timeouts_limits_biz_type_valid CHECK (biz_type ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    -- NaN compares above Infinity in PostgreSQL: `< 'Infinity'` rejects both.
    CONSTRAINT timeouts_limits_rate_limits_valid CHECK (
        (declared_rate_limit > 0 AND declared_rate_limit < 'Infinity') IS NOT FALSE
        AND (rate_limit > 0 AND rate_limit < 'Infinity') IS NOT FALSE),
    CONSTRAINT timeouts_limits_concurrencies_valid CHECK (declared_concurrency >= 1 IS NOT FALSE AND concurrency >= 1 IS NOT FALSE),
    CONSTRAINT timeouts_limits_override_only_when_overridden CHECK (overridden OR (rate_limit IS NULL AND concurrency IS NULL)),
    CONSTRAINT timeouts_limits_tokens_valid CHECK (tokens >= 0 AND tokens < 'Infinity')
);

-- Fair claiming: the claim steps from one biz_type with PENDING tasks to the next through this
-- index (one probe each, however many tasks wait), then takes each biz_type's share of a claim in
-- run_at order. Partial, like timeouts_task_due: it only holds waiting tasks.
--
-- On a large existing table this builds the index on every partition while holding a SHARE lock
-- on it (writes wait; a partitioned index cannot be built CONCURRENTLY): see the how-to
-- "Isolating businesses" to build it beforehand without blocking writes (IF NOT EXISTS then skips
-- it here).
CREATE INDEX IF NOT EXISTS timeouts_task_due_by_type ON timeouts_task (biz_type, run_at) WHERE status = :PENDING;
