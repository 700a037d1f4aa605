-- Business isolation: the limits, pauses and lateness policies of biz_types, each shard's part of
-- the limits, and the index fair claiming walks.

-- One row per biz_type that has limits, a pause, a lateness policy, or a handler that declares
-- any. Small and unpartitioned: the claim reads it (and locks the rows of the limited biz_types it
-- claims), the limits functions (timeouts/limiting/controls.py) write it. What is in force for a
-- biz_type: rate_limit and concurrency when overridden, else the declared ones; NULL means no
-- limit.
CREATE TABLE timeouts_limits (
    biz_type             varchar(64)      PRIMARY KEY,
    -- What the handler declares (@timeouts.handler(rate_limit=, concurrency=)): the claimers write
    -- the values of the code they run (declare(), timeouts/limiting/controls.py).
    declared_rate_limit  double precision,
    declared_concurrency integer,
    -- set_limits(): these replace the declared values until reset_limits().
    overridden           boolean          NOT NULL DEFAULT false,
    rate_limit           double precision,
    concurrency          integer,
    -- pause(): no task of this biz_type is claimed until resume().
    paused               boolean          NOT NULL DEFAULT false,
    -- The rate limit's token bucket, kept by the claim: `tokens` claims were allowed at
    -- `refilled_at` (database clock); it refills at the rate (timeouts_bucket_tokens, below).
    -- NULL refilled_at: full.
    tokens               double precision NOT NULL DEFAULT 0,
    refilled_at          timestamptz,
    modified_at          timestamptz      NOT NULL DEFAULT clock_timestamp(),
    -- Limits across shards: with several shards (TIMEOUTS["SHARDS"]) every shard claims from its
    -- own table, so a limit held whole on each would let N times the limit through. Each shard's
    -- row says instead what part of the limit in force its claims may use, as a fraction of it:
    -- the rest belongs to the other shards. timeouts/limiting/shares.py sets the parts after demand,
    -- so that they add up to at most the whole; NULL (a new row, or one shard) means an even part:
    -- 1/N of the rate, and an even integer split of the concurrency. Fractions rather than numbers
    -- of tasks: a new limit (set_limits(), a deploy) is then shared as the old one was, on each
    -- shard as soon as it is written there.
    rate_share           double precision,
    concurrency_share    double precision,
    -- The limits in force, kept by PostgreSQL beside the values they come from: the override when
    -- set_limits() made one, else what the handler declares; NULL means no limit. Every statement
    -- that honours or shows a limit reads these two columns, so the rule lives here alone. Stored,
    -- so reading them costs the claim nothing.
    rate_limit_in_force  double precision
        GENERATED ALWAYS AS (CASE WHEN overridden THEN rate_limit ELSE declared_rate_limit END) STORED,
    concurrency_in_force integer
        GENERATED ALWAYS AS (CASE WHEN overridden THEN concurrency ELSE declared_concurrency END) STORED,
    -- The lateness policy (timeouts/limiting/lateness.py): how late an attempt may start, and what
    -- becomes of one that starts later, kept as the limits are. The worker's compare-and-set
    -- (start_task, sql/queries/attempts.sql) reads the two columns in force, in the statement that
    -- starts the attempt. What the handler declares (@timeouts.handler(max_lateness=, on_late=)),
    -- written by the claimers as its limits are; NULL max_lateness: no limit.
    declared_max_lateness interval,
    declared_on_late      varchar(4)       NOT NULL DEFAULT 'run',
    -- set_limits(max_lateness=, on_late=): these replace the declared values until reset_limits().
    -- Apart from the limits' own `overridden`: changing one does not change the other.
    lateness_overridden   boolean          NOT NULL DEFAULT false,
    max_lateness          interval,
    on_late               varchar(4),
    -- The policy in force, kept by PostgreSQL as the limits in force are: the override when
    -- set_limits() made one, else what the handler declares.
    max_lateness_in_force interval
        GENERATED ALWAYS AS (CASE WHEN lateness_overridden THEN max_lateness ELSE declared_max_lateness END) STORED,
    on_late_in_force      varchar(4)
        GENERATED ALWAYS AS (CASE WHEN lateness_overridden THEN on_late ELSE declared_on_late END) STORED,
    CONSTRAINT timeouts_limits_biz_type_valid CHECK (biz_type ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    -- NaN compares above Infinity in PostgreSQL: `< 'Infinity'` rejects both.
    CONSTRAINT timeouts_limits_rate_limits_valid CHECK (
        (declared_rate_limit > 0 AND declared_rate_limit < 'Infinity') IS NOT FALSE
        AND (rate_limit > 0 AND rate_limit < 'Infinity') IS NOT FALSE),
    CONSTRAINT timeouts_limits_concurrencies_valid CHECK (declared_concurrency >= 1 IS NOT FALSE AND concurrency >= 1 IS NOT FALSE),
    CONSTRAINT timeouts_limits_override_only_when_overridden CHECK (overridden OR (rate_limit IS NULL AND concurrency IS NULL)),
    CONSTRAINT timeouts_limits_tokens_valid CHECK (tokens >= 0 AND tokens < 'Infinity'),
    -- A rate share is never 0: the claim's token bucket refills at the shared rate, and the
    -- dispatcher divides by it. A concurrency share may be 0: none of the biz_type's tasks may start
    -- here now.
    CONSTRAINT timeouts_limits_shares_valid CHECK (
        (rate_share > 0 AND rate_share <= 1) IS NOT FALSE
        AND (concurrency_share >= 0 AND concurrency_share <= 1) IS NOT FALSE),
    CONSTRAINT timeouts_limits_max_lateness_valid CHECK (
        (declared_max_lateness > interval '0') IS NOT FALSE AND (max_lateness > interval '0') IS NOT FALSE),
    CONSTRAINT timeouts_limits_on_late_valid CHECK (
        declared_on_late IN ('run', 'skip', 'dead') AND (on_late IN ('run', 'skip', 'dead')) IS NOT FALSE),
    -- Skipping or making dead what is late needs to know how late is too late.
    CONSTRAINT timeouts_limits_on_late_needs_max_lateness CHECK (
        (declared_on_late = 'run' OR declared_max_lateness IS NOT NULL)
        AND (on_late = 'run' OR max_lateness IS NOT NULL) IS NOT FALSE),
    CONSTRAINT timeouts_limits_lateness_override_only_when_overridden CHECK (
        CASE WHEN lateness_overridden THEN on_late IS NOT NULL ELSE on_late IS NULL AND max_lateness IS NULL END)
);

-- Fair claiming: the claim steps from one biz_type with PENDING tasks to the next through this
-- index (one probe each, however many tasks wait), then takes each biz_type's share of a claim in
-- run_at order. Partial, like timeouts_task_due: it only holds waiting tasks.
CREATE INDEX timeouts_task_due_by_type ON timeouts_task (biz_type, run_at) WHERE status = :PENDING;

-- A limit as the claims read it: within the bounds the API accepts (timeouts/validation.py: a rate
-- from one start a day to a million a second, a concurrency from one to a million), so that a row
-- written by hand past them cannot take the claim's arithmetic out of range, which would stop the
-- claims of every biz_type on the shard. CASE rather than least() and greatest(), which would turn
-- NULL (no limit) into a bound. Every function here is plain SQL without a query, and no more
-- volatile than its body: the planner inlines them (one into the other) into the claim's plan, as
-- if their expressions were written there.
CREATE FUNCTION timeouts_rate_in_bounds(rate_limit double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN rate_limit < 1.0 / 86400 THEN 1.0 / 86400 WHEN rate_limit > 1e6 THEN 1e6 ELSE rate_limit END
$$;

CREATE FUNCTION timeouts_concurrency_in_bounds(concurrency integer)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN concurrency < 1 THEN 1 WHEN concurrency > 1000000 THEN 1000000 ELSE concurrency END
$$;

-- A shard's part of a biz_type's limits, as the claims read them (claim_due, claimable_deadline)
-- and the stats show them: the whole limit on the only shard; else the part the scan stored, or an
-- even part until it has: 1/N of the rate, and the concurrency split into N integers that add up to
-- it. The limit within its bounds, and a stored rate part as at least a millionth of it (the scan
-- writes none below a tenth of an even part). NULL limit, NULL part.
CREATE FUNCTION timeouts_rate_part(rate_limit double precision, share double precision,
                                   shard_count integer)
RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT timeouts_rate_in_bounds(rate_limit)
           * CASE WHEN shard_count = 1 THEN 1
                  ELSE coalesce(CASE WHEN share < 1e-6 THEN 1e-6 ELSE share END, 1.0 / shard_count) END
$$;

CREATE FUNCTION timeouts_concurrency_split(concurrency integer, share double precision,
                                           shard_index integer, shard_count integer)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN shard_count = 1 THEN concurrency
                -- stored as a fraction of the limit: exact for the limit it was shared from
                WHEN share IS NOT NULL THEN floor(concurrency * share + 1e-9)::integer
                ELSE concurrency * (shard_index + 1) / shard_count - concurrency * shard_index / shard_count
           END
$$;

CREATE FUNCTION timeouts_concurrency_part(concurrency integer, share double precision,
                                          shard_index integer, shard_count integer)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT timeouts_concurrency_split(timeouts_concurrency_in_bounds(concurrency), share, shard_index, shard_count)
$$;

-- The rate limit's token bucket, as the claim keeps it in (tokens, refilled_at): it holds a
-- twentieth of a second's worth of claims (and at least one, so a rate below 20/s can claim at
-- all), and refills at the rate. Small, so the starts of a backlog are spread evenly, never more than
-- the rate in any second (a bucket of one second's worth would let twice the rate through in the
-- first); large enough that the claims that pace them come at most twenty a second (a dispatcher
-- sleeps until the bucket is full: timeouts_bucket_full_at). `rate_limit` is a shard's part, as
-- timeouts_rate_part gives it.
CREATE FUNCTION timeouts_bucket_size(rate_limit double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(rate_limit / 20, 1)
$$;

-- The claims a bucket allows at `at_time`: what it held at refilled_at, refilled at the rate since,
-- up to its size; a bucket never used (NULL refilled_at) is full. NULL: no rate limit.
CREATE FUNCTION timeouts_bucket_tokens(rate_limit double precision, tokens double precision,
                                       refilled_at timestamptz, at_time timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN rate_limit IS NULL THEN NULL
                WHEN refilled_at IS NULL THEN timeouts_bucket_size(rate_limit)
                ELSE least(timeouts_bucket_size(rate_limit),
                           tokens + rate_limit * greatest(0, extract(epoch FROM at_time - refilled_at)))
           END
$$;

-- When a bucket is full again; NULL when it is (or no rate limit). STABLE as timestamptz + interval.
CREATE FUNCTION timeouts_bucket_full_at(rate_limit double precision, tokens double precision,
                                        refilled_at timestamptz)
RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN tokens < timeouts_bucket_size(rate_limit)
                THEN refilled_at + (timeouts_bucket_size(rate_limit) - tokens) / rate_limit * interval '1 second'
           END
$$;
