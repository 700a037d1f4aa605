-- The database's clock, which every due time is read against.
-- Parameters use Django's %(name)s style, so a literal percent sign is written %%.


-- name: database_now
-- The database clock, now.
SELECT clock_timestamp() AS now;
