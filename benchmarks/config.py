"""The bench's options: one frozen object, with its defaults and a check of itself."""

from dataclasses import dataclass

SCENARIOS = ("spread", "burst", "drain", "publish", "schedule", "idle", "defaults")
# DurableTask against Celery's own ETA (benchmarks/durable.py): asked for by name.
DURABLE_SCENARIOS = ("durable_spread", "durable_memory", "durable_restart", "durable_cost", "durable_cpu")
# Django's tasks framework through TimeoutsBackend, against django-tasks-db (benchmarks/tasks_backend.py).
TASKS_SCENARIOS = ("tasks_spread", "tasks_drain", "tasks_enqueue")
# Business isolation: a neighbour's backlog, a rate limit, fair claiming's cost (benchmarks/isolation.py).
ISOLATION_SCENARIOS = ("isolation_neighbour", "isolation_rate", "isolation_cost")
# Shards: throughput and CPU cost over 1-4 shards, an outage, idle cost, one shard's overhead, a rate limit across
# shards (benchmarks/shards.py).
SHARDS_SCENARIOS = ("shards_drain", "shards_outage", "shards_idle", "shards_overhead", "shards_rate")
# on_conflict="debounce" against "replace", from several writer processes (benchmarks/debounce.py).
DEBOUNCE_SCENARIOS = ("debounce",)
# The lateness policy after an outage (benchmarks/late_recovery.py); tracing on against off (tracing_cost.py).
LATENESS_SCENARIOS, TRACING_SCENARIOS = ("late_recovery",), ("tracing",)
# The dispatcher with many pending tasks ahead and under a churn of cancels (benchmarks/scale.py).
SCALE_SCENARIOS = ("scale",)
KNOWN_SCENARIOS = (SCENARIOS + DURABLE_SCENARIOS + TASKS_SCENARIOS + ISOLATION_SCENARIOS + SHARDS_SCENARIOS
                   + DEBOUNCE_SCENARIOS)
KNOWN_SCENARIOS += LATENESS_SCENARIOS + TRACING_SCENARIOS + SCALE_SCENARIOS
PATHS = ("scan", "dispatcher", "celery")  # celery = the same no-op body published directly
PATH_LABELS = {"scan": "scan only", "dispatcher": "dispatcher", "celery": "celery direct"}
PEER_SYSTEMS = ("naive_ln", "naive_poll", "procrastinate", "celery", "django_tasks")
# Which paths each scenario runs; schedule measures the API alone, idle the processes that wait.
SCENARIO_PATHS = {
    "spread": PATHS,
    "burst": PATHS,
    "drain": PATHS,
    "publish": PATHS,  # drain without a worker: the claimer's own capacity
    "schedule": (),
    "idle": ("scan", "dispatcher"),
    "defaults": (),  # the dispatcher, under two settings modules: its variants are its paths
    # Their variants are their paths.
    **{name: () for name in DURABLE_SCENARIOS + TASKS_SCENARIOS + ISOLATION_SCENARIOS + SHARDS_SCENARIOS
       + DEBOUNCE_SCENARIOS},
    **{name: () for name in LATENESS_SCENARIOS + TRACING_SCENARIOS + SCALE_SCENARIOS},
}


@dataclass(frozen=True)
class BenchConfig:
    scenarios: tuple = SCENARIOS
    paths: tuple = PATHS
    repeat: int = 1
    n_spread: int = 2000
    window: float = 10.0  # spread: seconds over which the tasks fall due
    n_burst: int = 1000
    n_drain: int = 20000
    n_single: int = 5000  # schedule(): one call per task
    n_bulk: int = 20000  # bulk_schedule()
    bulk_chunk: int = 5000  # tasks per bulk_schedule() call
    n_idle: int = 10000
    n_durable_spread: int = 2000  # durable_spread: calls due over the window
    n_durable_memory: int = 100000  # durable_memory: calls due in an hour
    n_durable_restart: int = 10000  # durable_restart: calls due from restart_from to restart_to
    n_durable_cost: int = 5000  # durable_cost: apply_async(countdown=3600) calls
    n_durable_cpu: int = 3000  # durable_cpu: calls of each kind whose CPU time is read
    cpu_rate: float = 200.0  # durable_cpu: calls per second (0: as fast as they go)
    cpu_idle_seconds: float = 5.0  # durable_cpu: the idle reading before each run (0: none)
    n_tasks_spread: int = 2000  # tasks_spread: Django tasks with run_after over the window
    n_tasks_drain: int = 20000  # tasks_drain: Django tasks ready to run
    n_tasks_enqueue: int = 5000  # tasks_enqueue: enqueue() calls, due in an hour
    n_backlog: int = 100000  # isolation_neighbour: one biz_type's tasks already due
    n_isolation_spread: int = 2000  # isolation_neighbour: another's, due over the window
    n_rate: int = 2000  # isolation_rate: rate-limited tasks due at one instant
    n_claim: int = 20000  # isolation_cost: the backlog each claim_due claims
    n_shards_drain: int = 20000  # shards_drain: tasks due at once, over all the shards
    n_shards_outage: int = 2000  # shards_outage: tasks due over the window, over all three shards
    n_debounce: int = 10000  # debounce: keys, each scheduled debounce_calls times
    debounce_calls: int = 10  # debounce: calls per key
    debounce_writers: int = 4  # debounce: writer processes making the calls together
    debounce_block: int = 250  # debounce: keys whose calls a writer makes together, round by round
    debounce_delay: float = 5.0  # debounce: seconds, each call's delay
    debounce_max_wait: float = 6.0  # debounce: seconds, on_conflict="debounce"'s max_wait
    n_late: int = 10000  # late_recovery: tasks due during the outage, half of them skipped when late
    outage: float = 60.0  # late_recovery: seconds without a worker
    late_stream: float = 120.0  # late_recovery: seconds of on-time tasks due from the restart
    late_work_ms: float = 10.0  # late_recovery: milliseconds each handler waits after recording its start
    scale_rows: int = 100000  # scale: pending tasks due in the partitions ahead (the background)
    scale_lead: float = 3600.0  # scale: seconds from the load to the background's first due time
    scale_jobs: int = 2  # scale: connections loading (and vacuuming) the background side by side
    churn_rate: float = 50.0  # scale: tasks the churn schedules per second
    churn_ahead: float = 20.0  # scale: seconds from a churned task's scheduling to its due time
    churn_cancel: float = 0.8  # scale: the share of the churn's tasks cancelled before they fall due
    repo: str = ""  # isolation_cost: the git repository with the previous claim_due (default: the project)
    claim_sql_commit: str = ""  # isolation_cost: the commit whose claim_due is "previous" (default: found)
    shards_base_commit: str = ""  # shards_overhead: the code before shards (default: found)
    restart_from: float = 30.0  # durable_restart: seconds from the first call to the first due time
    restart_to: float = 60.0  # ... and to the last
    restart_kill_at: float = 40.0  # ... and to the kill -9 of every worker process
    restart_down: float = 5.0  # seconds until a new worker starts
    memory_settle: float = 5.0  # durable_memory: seconds between the last call held and the RSS reading
    lead: float = 5.0  # spread/burst: seconds from "start scheduling" to the first due time
    idle_settle: float = 10.0
    idle_seconds: float = 20.0
    scan_interval: float = 5.0
    concurrency: int = 2
    celery_app: str = "project"
    database: str = "timeouts_bench"
    keep_db: bool = False
    broker_url: str = "redis://127.0.0.1:6379/14"
    json_path: str = ""
    dispatcher_args: tuple = ()
    peers: tuple = ()
    peers_src: str = ""
    peers_dir: str = "/tmp/peerbench"
    peers_redis_url: str = "redis://127.0.0.1:6379/15"
    pg_log: str = ""
    seed: int = 1
    wait_tail: float = 30.0  # seconds to wait for stragglers after the last due time
    drain_timeout: float = 600.0

    def __post_init__(self):
        problems = []
        for name in ("scenarios", "paths", "peers"):
            known = {"scenarios": KNOWN_SCENARIOS, "paths": PATHS, "peers": PEER_SYSTEMS}[name]
            unknown = [v for v in getattr(self, name) if v not in known]
            if unknown:
                problems.append(f"unknown {name}: {', '.join(unknown)} (known: {', '.join(known)})")
        for name in ("repeat", "n_spread", "n_burst", "n_drain", "n_single", "n_bulk", "bulk_chunk", "concurrency",
                     "n_durable_spread", "n_durable_memory", "n_durable_restart", "n_durable_cost", "n_durable_cpu",
                     "n_tasks_spread", "n_tasks_drain", "n_tasks_enqueue", "n_backlog", "n_isolation_spread",
                     "n_rate", "n_claim", "n_shards_drain", "n_shards_outage", "n_debounce", "debounce_calls",
                     "debounce_writers", "debounce_block", "n_late", "scale_rows", "scale_jobs"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        for name in ("n_idle", "cpu_rate", "cpu_idle_seconds", "late_work_ms"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        for name in ("window", "lead", "idle_seconds", "scan_interval", "restart_from", "restart_down",
                     "debounce_delay", "debounce_max_wait", "outage", "late_stream", "scale_lead", "churn_rate",
                     "churn_ahead"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0")
        if not 0 <= self.churn_cancel <= 1:
            problems.append("churn_cancel must be between 0 and 1")
        if not self.restart_from <= self.restart_kill_at <= self.restart_to or self.restart_from == self.restart_to:
            problems.append("restart_from < restart_to, and restart_kill_at between them")
        if problems:
            raise ValueError("; ".join(problems))

    def paths_for(self, scenario):
        return tuple(p for p in SCENARIO_PATHS[scenario] if p in self.paths)

    def public(self) -> dict:
        """The options as written to the JSON."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}
