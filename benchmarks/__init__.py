"""The benchmark behind `manage.py timeouts_bench`: one moving part per module.

    config     options and defaults            runner     the whole run: setup, repeats, teardown
    database   the bench's own database        processes  worker, dispatcher, scan loop (by PID)
    handlers   the no-op handler + Celery task  scan_loop  the beat-equivalent safety scan process
    workload   scheduling / publishing tasks   scenarios  spread, burst, drain on one path
    throughput schedule() vs raw INSERT/COPY   idle       queries/s and CPU of an idle process
    stats      lateness, missing, duplicates   report     medians, tables, JSON
    targets    ratios and the targets
    machine    what the numbers were measured on           peers      the shared peer harness
    progress   progress display on stderr                  clusters   a throwaway PostgreSQL cluster
    shards     the shard scenarios' wiring                 shard_load   drain and outage over shards
    shard_costs  idle and single-shard overhead            shard_servers  shard databases, CPU meter
    late_recovery  an outage, with a lateness policy and without  tracing_cost  tracing on against off
    span_sink    OpenTelemetry's SDK whose spans are dropped (tracing on: settings_tracing)
    held_process  a child held ready until told to go, and its result line (debounce, durable_cpu)

Nothing here is imported by the runtime: the handlers exist only in processes that import
`benchmarks.handlers` (the bench itself, and its worker via `--include`).
"""
