"""Optional: the shared peer harness (../shared/bench/peers) in the same run, for side-by-side ratios.

The harness runs from a copy in PEERS_DIR (default /tmp/peerbench, as its README says) with a
virtualenv of its own, created on demand with pip. It is called through its own driver, run_all.py,
once per scenario and repeat (`--reps 1`), between the bench's own runs, so machine noise falls on
both alike. Its JSON lines are read back and kept in the bench's JSON.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .progress import note

PACKAGES = {
    None: ["psycopg[binary]==3.3.9", "psutil", "redis"],
    "celery": ["celery[redis]==5.7.0"],
    "procrastinate": ["procrastinate==3.10.0"],
    "django_tasks": ["django-tasks==0.12.0", "django-tasks-db==0.13.0", "django<6"],
}
IMPORTS = {None: "psycopg, psutil, redis", "celery": "celery", "procrastinate": "procrastinate",
           "django_tasks": "django_tasks_db"}
DATABASES = {"naive_ln": "pb_naive", "naive_poll": "pb_naive", "procrastinate": "pb_procr", "django_tasks": "pb_djt"}
# the bench's scenario -> the harness's scenario(s) and which size option feeds its --n
SCENARIOS = {"spread": [("spread", "n_spread")], "burst": [("burst", "n_burst")], "drain": [("drain", "n_drain")],
             "idle": [("idle", "n_idle")], "schedule": [("sched_single", "n_single"), ("sched_bulk", "n_bulk")]}


# The tasks_* scenarios run the django_tasks system's own script, with the bench's window and lead
# (run_all.py passes neither): the bench's scenario -> the script's scenario and the size option.
TASKS_SCENARIOS = {"tasks_spread": ("spread", "n_tasks_spread"), "tasks_drain": ("drain", "n_tasks_drain"),
                   "tasks_enqueue": ("sched_single", "n_tasks_enqueue")}
TASKS_SYSTEM, TASKS_SCRIPT = "django_tasks", "pb_djt.py"


class Peers:
    def __init__(self, cfg, db, out_path: Path):
        self.cfg, self.db = cfg, db
        self.systems = list(cfg.peers)
        self.src, self.dir = Path(cfg.peers_src), Path(cfg.peers_dir)
        self.python = self.dir / "venv" / "bin" / "python"
        # Absolute: the harness runs in its own directory, and writes where --out says.
        self.out = Path(out_path).resolve()
        self.log = self.out.with_suffix(".log")
        self.ready = False
        self.created = []  # the databases setup() created, for drop_databases()

    def setup(self):
        """Copy the harness, build its virtualenv if needed, create its databases. Raises on failure."""
        if not (self.src / "run_all.py").exists():
            raise FileNotFoundError(f"no peer harness at {self.src}")
        (self.dir / "runs").mkdir(parents=True, exist_ok=True)
        (self.dir / "results").mkdir(parents=True, exist_ok=True)
        for path in list(self.src.glob("*.py")) + list(self.src.glob("*.md")):
            shutil.copy2(path, self.dir / path.name)
        kinds = [None] + [s for s in self.systems if s in PACKAGES]
        if not self.python.exists():
            note(f"peers: creating the harness's virtualenv in {self.dir / 'venv'}")
            self._run([sys.executable, "-m", "venv", str(self.dir / "venv")], "creating the virtualenv")
        missing = [k for k in kinds if subprocess.run([str(self.python), "-c", f"import {IMPORTS[k]}"],
                                                      check=False, capture_output=True).returncode != 0]
        if missing:
            packages = [p for k in missing for p in PACKAGES[k]]
            note(f"peers: pip install {' '.join(packages)}")
            self._run([str(self.python), "-m", "pip", "install", "-q", *packages], "pip install", timeout=900)
        with self.db.admin() as admin:
            for system in self.systems:
                name = DATABASES.get(system)
                if name and not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                    admin.execute(f'CREATE DATABASE "{name}"')
                    self.created.append(name)
        if "django_tasks" in self.systems:
            env = {**self.env(), "DJANGO_SETTINGS_MODULE": "pb_django_settings", "PYTHONPATH": str(self.dir)}
            self._run([str(self.python), "-m", "django", "migrate", "-v", "0"], "migrating pb_djt", env=env)
        self.ready = True

    def drop_databases(self):
        """Drop the databases setup() created (one that existed before is left alone)."""
        with self.db.admin() as admin:
            while self.created:
                admin.execute(f'DROP DATABASE IF EXISTS "{self.created.pop()}" WITH (FORCE)')

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items()
               if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH", "CELERY_BROKER_URL")}
        base = self.db.base
        env.update(PB_PGHOST=base.get("HOST") or "127.0.0.1", PB_PGUSER=base.get("USER") or "postgres",
                   PB_REDIS_URL=self.cfg.peers_redis_url, PB_LEAD=str(self.cfg.lead))
        return env

    def _run(self, args, what, env=None, timeout=300):
        done = subprocess.run(args, check=False, cwd=self.dir, env=env or self.env(), capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"peers: {what} failed:\n{done.stdout[-1500:]}{done.stderr[-1500:]}")

    def run(self, scenario, rep) -> list[dict]:
        """One repeat of one scenario for every peer system, through run_all.py; returns its results,
        tagged with the bench's repeat and scenario."""
        if not self.ready:
            return []
        if scenario in TASKS_SCENARIOS:
            return self._run_tasks_peer(scenario, rep)
        new = []
        for peer_scenario_name, size in SCENARIOS.get(scenario, ()):
            n = getattr(self.cfg, size)
            args = [str(self.python), "run_all.py", "--reps", "1", "--systems", ",".join(self.systems),
                    "--scenarios", peer_scenario_name, "--n", str(n), "--out", str(self.out), "--timeout", "600"]
            note(f"peers: {peer_scenario_name} (n={n}) for {', '.join(self.systems)}, repeat {rep + 1}")
            before = len(load(self.out))
            with open(self.log, "a") as log:
                subprocess.run(args, check=False, cwd=self.dir, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                               timeout=600 * len(self.systems) + 120)
            for record in load(self.out)[before:]:
                new.append({**record, "bench_rep": rep, "bench_scenario": scenario})
        return new

    def _run_tasks_peer(self, scenario, rep) -> list[dict]:
        """django-tasks-db on the same workload as the bench's tasks_* scenario. Its records are
        named after the bench's scenario, so they pair with no other scenario's runs."""
        if TASKS_SYSTEM not in self.systems:
            return []
        script_scenario, size = TASKS_SCENARIOS[scenario]
        n = getattr(self.cfg, size)
        args = [str(self.python), TASKS_SCRIPT, script_scenario, "--n", str(n), "--window", str(self.cfg.window),
                "--lead", str(self.cfg.lead)]
        note(f"peers: {TASKS_SYSTEM} {script_scenario} (n={n}), repeat {rep + 1}")
        before = len(load(self.out))
        with open(self.log, "a") as log:
            subprocess.run(args, check=False, cwd=self.dir, env={**self.env(), "PB_JSONL": str(self.out)},
                           stdout=log, stderr=subprocess.STDOUT, timeout=900)
        return [{**record, "scenario": scenario, "peer_scenario": record.get("scenario"), "bench_rep": rep,
                 "bench_scenario": scenario} for record in load(self.out)[before:]]


def load(path: Path) -> list[dict]:
    """The harness's result lines (errors included, as {"error": ...})."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def peer_scenario(record) -> str:
    """The harness renames non-default sizes (spread_n2000, idle_0k): back to the base scenario."""
    name = record.get("scenario") or ""
    for base in ("sched_single", "sched_bulk", "spread", "burst", "drain", "idle"):
        if name == base or name.startswith(base + "_"):
            return base
    return name
