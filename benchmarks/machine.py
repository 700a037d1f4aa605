"""What the numbers were measured on: hardware, load, and the versions of everything involved."""

import os
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata


def _version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _ram_gb():
    try:
        import psutil

        return round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)


def _redis(url):
    try:
        import redis

        client = redis.Redis.from_url(url)
        try:
            return client.info("server").get("redis_version")
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 -- only a description: never fail the run for it
        return f"unknown ({exc.__class__.__name__})"


def describe(conn, broker_url) -> dict:
    """conn: a psycopg connection to the bench database."""
    import psycopg

    pg = {name: conn.execute(f"SHOW {name}").fetchone()[0]
          for name in ("server_version", "fsync", "synchronous_commit", "shared_buffers", "max_connections")}
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hostname": socket.gethostname(),
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "ram_gb": _ram_gb(),
        "kernel": platform.release(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "postgresql": pg,
        "redis": _redis(broker_url),
        "python": sys.version.split()[0],
        "django": _version("Django"),
        "celery": _version("celery"),
        "kombu": _version("kombu"),
        "psycopg": psycopg.__version__,
        "libpq": f"{psycopg.pq.version() // 10000}.{psycopg.pq.version() % 10000}",
        "redis_py": _version("redis"),
    }


def code_version(root) -> dict:
    """The commit measured, and the files that differed from it (the bench measures the working tree)."""
    def git(*args):
        done = subprocess.run(["git", *args], cwd=root, check=False, capture_output=True, text=True, timeout=30)
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "subject": git("log", "-1", "--format=%s"),
            "modified": status.splitlines() if status else []}


def loadavg():
    return [round(x, 2) for x in os.getloadavg()]


def cpu_times() -> tuple[int, int] | None:
    """(steal, total) CPU time since boot, in ticks, summed over the CPUs; None where /proc/stat is
    not there (not Linux). Steal is time the hypervisor gave this VM's CPUs to someone else."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(field) for field in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice, already inside user and nice]
    return (ticks[7], sum(ticks[:8])) if len(ticks) >= 8 else None


def steal_pct(before, after) -> float | None:
    """The share of CPU time stolen between two cpu_times() readings, in percent."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round(100.0 * (after[0] - before[0]) / (after[1] - before[1]), 1)
