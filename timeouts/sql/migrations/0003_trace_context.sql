-- The trace context of the code that scheduled each task (timeouts/tracing.py): with OpenTelemetry
-- installed and a span active, schedule(), bulk_schedule(), a DurableTask call with an eta and a
-- task of Django's tasks framework store the W3C traceparent, then a space and the tracestate if
-- any; NULL otherwise. The claim and the worker's start return it, and the dispatch and each
-- attempt's run are spans linked to it.
--
-- A nullable column without a default: adding it changes only the catalog, whatever the table
-- holds, and the partitions take it from the parent. It still needs the ACCESS EXCLUSIVE lock of
-- the parent and every partition for that instant, and would queue every claim behind itself while
-- it waited for one in progress: if it waits longer than the lock_timeout, the migration fails
-- instead of stalling dispatch, and can be run again.
SET LOCAL lock_timeout = '10s';
ALTER TABLE timeouts_task ADD COLUMN trace_context text;
