-- Dispatcher queries (see timeouts/dispatcher.py). They run on the dispatcher's LISTEN connection.


-- name: nearest_deadline
-- When the next PENDING task becomes due, and the database clock now, both as Unix epoch seconds
-- (the NOTIFY payloads use the same unit). min() over the partial index timeouts_task_due is one
-- index probe per partition (a MinMaxAgg over a Merge Append of index-only scans), however many
-- tasks wait. Also the dispatcher's keepalive.
SELECT extract(epoch FROM (SELECT min(run_at) FROM timeouts_task WHERE status = :PENDING))::float8 AS deadline,
       extract(epoch FROM clock_timestamp())::float8 AS now;
