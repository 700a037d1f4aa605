"""The bench's options: one frozen object, with its defaults and a check of itself."""

from dataclasses import dataclass

SCENARIOS = ("spread", "burst", "drain", "publish", "schedule", "idle", "defaults")
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
            known = {"scenarios": SCENARIOS, "paths": PATHS, "peers": PEER_SYSTEMS}[name]
            unknown = [v for v in getattr(self, name) if v not in known]
            if unknown:
                problems.append(f"unknown {name}: {', '.join(unknown)} (known: {', '.join(known)})")
        for name in ("repeat", "n_spread", "n_burst", "n_drain", "n_single", "n_bulk", "bulk_chunk", "concurrency"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        if self.n_idle < 0:
            problems.append("n_idle must be >= 0")
        for name in ("window", "lead", "idle_seconds", "scan_interval"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0")
        if problems:
            raise ValueError("; ".join(problems))

    def paths_for(self, scenario):
        return tuple(p for p in SCENARIO_PATHS[scenario] if p in self.paths)

    def public(self) -> dict:
        """The options as written to the JSON."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}
