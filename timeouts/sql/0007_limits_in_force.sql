-- The limits in force of each biz_type, kept by PostgreSQL beside the values they come from: the
-- override when set_limits() made one, else what the handler declares; NULL means no limit. Every
-- statement that honours or shows a limit reads these two columns, so the rule lives here alone.
-- Stored, so reading them costs the claim nothing; the table is small (a row per biz_type), and
-- adding them rewrites it.
ALTER TABLE timeouts_limits
    ADD COLUMN IF NOT EXISTS rate_limit_in_force double precision
        GENERATED ALWAYS AS (CASE WHEN overridden THEN rate_limit ELSE declared_rate_limit END) STORED,
    ADD COLUMN IF NOT EXISTS concurrency_in_force integer
        GENERATED ALWAYS AS (CASE WHEN overridden THEN concurrency ELSE declared_concurrency END) STORED;
