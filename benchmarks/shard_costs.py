"""What shards cost when they are not needed: shards_idle and shards_overhead.

- shards_idle: one dispatcher process waiting on 1, 2 and 4 shards (databases on the bench's
  server) with N tasks due in an hour among them, measured as the `idle` scenario measures one:
  queries/s from the server log (statement logging switched on for the shards' databases only),
  CPU of the process. Per shard, both should stay flat as shards are added.
- shards_overhead: `publish` and `drain` (benchmarks/scenarios.py, the dispatcher path) on one
  database, run by the working tree and by the code before shards (a `git archive` of that commit
  in var/bench/), side by side in each repeat: the dispatcher and the worker each come from the
  tree measured.
"""

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import psycopg

from . import idle, scenarios
from .database import BenchError
from .handlers import NOOP
from .processes import Processes
from .progress import note
from .shard_load import COUNTS, guarded, on_shard, shard_of
from .shard_servers import ShardSet
from .workload import db_now

# --- shards_idle ---------------------------------------------------------------------------------


def idle_cost(ctx, rep) -> dict:
    counts = COUNTS if rep % 2 == 0 else tuple(reversed(COUNTS))
    with ShardSet(ctx, max(COUNTS), "server") as shard_set:
        return {f"shards_{k}": guarded(f"shards_idle/{k}/rep{rep + 1}", _idle_one, ctx, shard_set, k, rep)
                for k in counts}


def _idle_one(ctx, shard_set, k, rep) -> dict:
    cfg = ctx.cfg
    shard_set.reset(k)
    base = db_now(shard_set.conns[0]) + timedelta(hours=1)
    by_shard = {}
    for key in range(cfg.n_idle):
        by_shard.setdefault(shard_of(key, k), []).append(key)
    for i, keys in by_shard.items():
        for first in range(0, len(keys), cfg.bulk_chunk):
            on_shard(shard_set, i).bulk_schedule([{"biz_type": NOOP, "biz_id": str(key),
                                                   "at": base + timedelta(milliseconds=key), "on_conflict": None}
                                                  for key in keys[first:first + cfg.bulk_chunk]])
    for conn in shard_set.conns[:k]:
        conn.execute("VACUUM ANALYZE timeouts_task")  # keeps autovacuum out of the window
    names = [shard_set.shards[i].params["dbname"] for i in range(k)]
    logging_on = _statement_logging(ctx, names, True)
    procs = Processes(env=shard_set.env(k), cwd=ctx.cwd, log_dir=ctx.log_dir, label=f"shards_idle/{k}/rep{rep + 1}")
    try:
        process = procs.dispatcher(cfg.dispatcher_args)
        note(f"shards_idle, {k} shard(s): settling {cfg.idle_settle:.0f} s, then measuring {cfg.idle_seconds:.0f} s")
        idle._sleep(cfg.idle_settle, procs)
        out = _measure(ctx, shard_set, names, process, procs, logging_on)
    finally:
        procs.stop_all()
        if logging_on:
            _statement_logging(ctx, names, False)
    out.update(n=cfg.n_idle, shards=k, per_shard_qps=round(out["idle_qps"] / k, 3),
               per_shard_cpu_pct=round(out["idle_cpu_pct"] / k, 3))
    return out


def _measure(ctx, shard_set, names, process, procs, logging_on) -> dict:
    """idle.measure() over several databases."""
    log = Path(ctx.pg_log) if (logging_on and ctx.pg_log) else None
    with ctx.db.admin() as admin:
        def xacts():
            return sum(idle._xacts(admin, name) for name in names)

        cpu0, xacts0, size0 = idle._cpu(process.pid), xacts(), idle._size(log)
        t0 = time.monotonic()
        idle._sleep(ctx.cfg.idle_seconds, procs)
        cpu1, xacts1, size1 = idle._cpu(process.pid), xacts(), idle._size(log)
        seconds = time.monotonic() - t0
    out = {"idle_xacts_per_s": round((xacts1 - xacts0) / seconds, 2),
           "idle_cpu_pct": round((cpu1 - cpu0) / seconds * 100.0, 2), "rss_mb": idle._rss_mb(process.pid)}
    if log is not None and size0 is not None and size1 is not None:
        own = shard_set.own_pids()
        counted = [idle.count_statements(log, size0, size1, name, exclude=own) for name in names]
        out.update(idle_qps=round(sum(q for q, _ in counted) / seconds, 2),
                   idle_round_trips_per_s=round(sum(t for _, t in counted) / seconds, 2),
                   idle_metric="statements in the server log")
    else:
        out.update(idle_qps=out["idle_xacts_per_s"], idle_metric="transactions/s (pg_stat_database)")
    return out


def _statement_logging(ctx, names, on) -> bool:
    """Statement logging on (for sessions opened later) or back to the server's default, for the
    shards' databases only; False if not possible."""
    if not ctx.pg_log:
        return False
    try:
        with ctx.db.admin() as admin:
            verb = "SET log_statement = 'all'" if on else "RESET log_statement"
            for name in names:
                admin.execute(f'ALTER DATABASE "{name}" {verb}')
        return True
    except psycopg.Error as exc:  # not a superuser, for instance: fall back to pg_stat_database
        note(f"shards_idle: cannot switch statement logging ({exc}); counting transactions instead")
        return False


# --- shards_overhead ---------------------------------------------------------------------------


def overhead(ctx, rep) -> dict:
    commit, root = before_shards(ctx)
    trees = {"sharded": ctx, "before_shards": dataclasses.replace(ctx, env=_env_for(ctx, root), cwd=root)}
    order = list(trees) if rep % 2 == 0 else list(reversed(trees))
    out = {name: {"shards_commit": commit[:10] if name == "before_shards" else "working tree"} for name in trees}
    # publish in one order, drain in the other: neither tree always runs first or last
    for scenario, names, metrics in (("publish", order, ("claim_per_s", "claimed")),
                                     ("drain", order[::-1], ("start_per_s", "missing", "duplicates", "early"))):
        for name in names:
            result = guarded(f"shards_overhead/{name}/{scenario}/rep{rep + 1}", scenarios.run, trees[name], scenario,
                             "dispatcher", rep)
            if "error" in result:
                out[name]["error"] = result["error"]
            out[name].update({metric: result.get(metric) for metric in metrics})
    return out


def before_shards(ctx) -> tuple[str, Path]:
    """(commit, tree): the code before shards, exported once into var/bench/. The commit is
    --shards-base-commit, or the parent of the commit that added timeouts/shards.py."""
    root = Path(ctx.cwd)

    def git(*args):
        try:
            return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True,
                                  timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            raise BenchError(f"shards_overhead exports the code before shards with git: {exc}") from None

    wanted = ctx.cfg.shards_base_commit
    if not wanted:
        added = git("log", "--diff-filter=A", "--format=%H", "--", "timeouts/shards.py").split()
        if not added:
            raise BenchError("no commit adds timeouts/shards.py: give --shards-base-commit")
        wanted = f"{added[-1]}^"
    commit = git("rev-parse", "--verify", f"{wanted}^{{commit}}")
    tree = root / "var" / "bench" / f"before-shards-{commit[:10]}"
    if not (tree / "manage.py").exists():
        partial = tree.with_name(tree.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        archive = subprocess.Popen(["git", "-C", str(root), "archive", commit], stdout=subprocess.PIPE)
        done = subprocess.run(["tar", "-x", "-C", str(partial)], stdin=archive.stdout, check=False, timeout=120)
        archive.stdout.close()
        if archive.wait(60) != 0 or done.returncode != 0:
            raise BenchError(f"could not export {commit[:10]} into {partial}")
        partial.rename(tree)
    _check_imports(ctx, tree)
    return commit, tree


def _env_for(ctx, tree) -> dict:
    """The bench's child environment with `tree` on the path instead of the project."""
    rest = [p for p in ctx.env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) != Path(ctx.cwd)]
    return {**ctx.env, "PYTHONPATH": os.pathsep.join([str(tree), *rest])}


def _check_imports(ctx, tree):
    """The children started in `tree` must import timeouts from it, not the installed working tree."""
    done = subprocess.run([sys.executable, "-c", "import timeouts; print(timeouts.__file__)"], env=_env_for(ctx, tree),
                          cwd=tree, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0 or not Path(done.stdout.strip()).is_relative_to(tree):
        raise BenchError(f"a process started in {tree} imports timeouts from {done.stdout.strip() or done.stderr}")

