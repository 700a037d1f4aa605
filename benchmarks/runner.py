"""The whole run: own database and broker, repeats interleaved across paths, results, teardown.

Within a repeat every scenario runs on every path back to back (scan only, dispatcher, Celery
direct, then the peers), so that machine noise falls on all of them alike.
"""

import dataclasses
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import (
    debounce,
    defaults,
    durable,
    idle,
    isolation,
    late_recovery,
    machine,
    report,
    scale,
    scenarios,
    shards,
    targets,
    tasks_backend,
    throughput,
    tracing_cost,
)
from .database import BenchDatabase, BenchError
from .peers import Peers
from .processes import child_env, dispatcher_available, flush_broker
from .progress import note


@dataclass
class Context:
    cfg: object
    db: BenchDatabase
    conn: object  # psycopg autocommit connection to the bench database
    alias: str  # Django alias of the bench database (the ORM API under test)
    app: object  # Celery app on the bench broker (the Celery-direct baseline)
    env: dict
    cwd: Path
    log_dir: Path
    pg_log: str = ""


def default_json_path(root) -> Path:
    return Path(root) / "var" / "bench" / f"timeouts_bench-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"


def celery_app(broker_url):
    from celery import Celery

    app = Celery("timeouts_bench", broker=broker_url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"], broker_connection_retry_on_startup=True)
    return app


def _sigterm(*_):
    raise SystemExit(143)  # so that every `finally` below stops its processes


def run(cfg, *, settings_module, root, broker_in_use=None) -> dict:
    try:
        import psutil  # noqa: F401
        import redis  # noqa: F401
    except ImportError as exc:
        raise BenchError(f"the bench needs {exc.name} (pip install {exc.name})") from None
    if broker_in_use and broker_in_use.rstrip("/") == cfg.broker_url.rstrip("/"):
        raise BenchError(f"--broker-url {cfg.broker_url} is the project's own broker: give the bench its own")
    json_path = Path(cfg.json_path) if cfg.json_path else default_json_path(root)
    log_dir = json_path.with_name(json_path.stem + "-logs")
    notes, paths = [], list(cfg.paths)
    missing_backend = [s for s in cfg.scenarios if s in tasks_backend.SCENARIOS and not tasks_backend.available()]
    if missing_backend:
        raise BenchError(f"{', '.join(missing_backend)} need timeouts.backends.TimeoutsBackend and Django's tasks "
                         "framework (Django 6.0, or the django-tasks backport)")
    if "dispatcher" in paths and not dispatcher_available():
        paths.remove("dispatcher")
        notes.append("the timeouts_dispatcher command does not exist here: dispatcher path skipped")
    cfg = dataclasses.replace(cfg, paths=tuple(paths))
    db = BenchDatabase(cfg.database)
    env = child_env(settings_module=settings_module, database_url=db.url(), broker_url=cfg.broker_url, root=root)
    previous = signal.signal(signal.SIGTERM, _sigterm)
    result = {"bench": "timeouts_bench", "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": " ".join(sys.argv), "config": cfg.public(), "settings_module": settings_module,
              "json_path": str(json_path), "log_dir": str(log_dir), "notes": notes}
    runs, peer_runs, peers = [], [], None
    try:
        note(f"bench database {db.name}: {'created' if db.create() else 'exists'}; migrating")
        db.migrate(env, root)
        alias = db.install_alias()
        app = celery_app(cfg.broker_url)
        with db.connect() as conn:
            result["machine"] = machine.describe(conn, cfg.broker_url)
            result["code"] = machine.code_version(root)
            if result["code"]["modified"]:
                notes.append(f"measured a working tree with uncommitted changes to {len(result['code']['modified'])} "
                             f"file(s) on top of {str(result['code']['commit'])[:10]} (listed in the JSON)")
            result["timeouts_settings"] = _timeouts_settings()
            idles = {"idle", "shards_idle"} & set(cfg.scenarios)
            pg_log = idle.find_pg_log(conn, cfg.pg_log) if idles else ""
            if idles and not pg_log:
                notes.append("the server log is not readable: idle queries/s are transactions/s instead")
            ctx = Context(cfg, db, conn, alias, app, env, Path(root), log_dir, pg_log)
            peers = _peers(cfg, db, json_path, notes)
            for rep in range(cfg.repeat):
                for scenario in cfg.scenarios:
                    runs += _scenario(ctx, scenario, rep, notes)
                    if peers:
                        peer_runs += peers.run(scenario, rep)
                    _finish(result, runs, peer_runs, cfg)
                    report.write_json(result, json_path)
        app.close()
    finally:
        signal.signal(signal.SIGTERM, previous)
        db.remove_alias()
        try:
            flush_broker(cfg.broker_url)
        except Exception as exc:  # noqa: BLE001 -- say so, and go on tearing down
            note(f"could not empty the bench broker: {exc}")
        if not cfg.keep_db:
            db.drop()
            if peers:
                peers.drop_databases()
    _finish(result, runs, peer_runs, cfg)
    result["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report.write_json(result, json_path)
    return result


def _scenario(ctx, scenario, rep, notes) -> list[dict]:
    """Every path of one scenario in one repeat. A failed run is recorded and the bench goes on."""
    cfg, out = ctx.cfg, []
    if scenario in ("schedule", "defaults", *durable.SCENARIOS, *tasks_backend.SCENARIOS, *isolation.SCENARIOS,
                    *shards.SCENARIOS, *debounce.SCENARIOS, *late_recovery.SCENARIOS, *tracing_cost.SCENARIOS,
                    *scale.SCENARIOS):
        note(f"repeat {rep + 1}/{cfg.repeat}: {scenario}")
        try:
            before = machine.cpu_times()
            if scenario in durable.SCENARIOS:
                variants = durable.run(ctx, scenario, rep)
            elif scenario in tasks_backend.SCENARIOS:
                variants = tasks_backend.run(ctx, scenario, rep)
            elif scenario in isolation.SCENARIOS:
                variants = isolation.run(ctx, scenario, rep)
            elif scenario in shards.SCENARIOS:
                variants = shards.run(ctx, scenario, rep)
            elif scenario in debounce.SCENARIOS:
                variants = debounce.run(ctx, scenario, rep)
            elif scenario in late_recovery.SCENARIOS:
                variants = late_recovery.run(ctx, scenario, rep)
            elif scenario in tracing_cost.SCENARIOS:
                variants = tracing_cost.run(ctx, scenario, rep)
            elif scenario in scale.SCENARIOS:
                variants = scale.run(ctx, scenario, rep)
            else:
                variants = (throughput if scenario == "schedule" else defaults).run(ctx, rep)
            steal = machine.steal_pct(before, machine.cpu_times())
            for variant, r in variants.items():
                if variant != "ratios":
                    out.append({"scenario": scenario, "path": variant, "rep": rep, "cpu_steal_pct": steal, **r})
                if "error" in r:  # a variant that failed on its own, the others measured
                    notes.append(f"{scenario}/{variant} repeat {rep + 1} failed: {r['error']}")
        except (BenchError, TimeoutError, OSError, RuntimeError, ValueError) as exc:
            out.append(_failed(scenario, "all", rep, exc, notes))
        return out
    for path in cfg.paths_for(scenario):
        note(f"repeat {rep + 1}/{cfg.repeat}: {scenario} on {path}")
        try:
            load, before = machine.loadavg()[0], machine.cpu_times()
            r = idle.run(ctx, path, rep) if scenario == "idle" else scenarios.run(ctx, scenario, path, rep)
            out.append({"scenario": scenario, "path": path, "rep": rep, "loadavg_1min": load,
                        "cpu_steal_pct": machine.steal_pct(before, machine.cpu_times()), **r})
        except (BenchError, TimeoutError, OSError, RuntimeError, ValueError) as exc:
            out.append(_failed(scenario, path, rep, exc, notes))
    return out


def _failed(scenario, path, rep, exc, notes) -> dict:
    message = f"{scenario}/{path} repeat {rep + 1} failed: {exc.__class__.__name__}: {exc}"
    note(message)
    notes.append(message)
    return {"scenario": scenario, "path": path, "rep": rep, "error": str(exc)}


def _peers(cfg, db, json_path, notes):
    if not cfg.peers:
        return None
    peers = Peers(cfg, db, json_path.with_name(json_path.stem + "-peers.jsonl"))
    try:
        peers.setup()
    except Exception as exc:  # noqa: BLE001 -- the peers are optional: the bench runs without them
        notes.append(f"peers skipped: {exc}")
        note(f"peers skipped: {exc}")
        return None
    return peers


def _finish(result, runs, peer_runs, cfg):
    summary = report.aggregate(runs)
    ratios = targets.ratios(runs, peer_runs)
    ratios.update(durable.ratios(runs))
    ratios.update(tasks_backend.ratios(runs, peer_runs))
    ratios.update(isolation.ratios(runs))
    ratios.update(shards.ratios(runs))
    ratios.update(debounce.ratios(runs))
    ratios.update(late_recovery.ratios(runs))
    ratios.update(tracing_cost.ratios(runs))
    ratios.update(scale.ratios(runs))
    schedule = targets.schedule_ratios(runs)
    if schedule:
        ratios.setdefault("schedule", {}).update(schedule)
    result.update(runs=runs, peer_runs=peer_runs, summary=summary, peers_summary=report.aggregate_peers(peer_runs),
                  ratios=ratios, targets=targets.targets(summary, ratios, cfg.scan_interval, cfg.scenarios),
                  loadavg_end=machine.loadavg())


def _timeouts_settings() -> dict:
    from timeouts.conf import get_settings

    return {k: (v.total_seconds() if hasattr(v, "total_seconds") else v) for k, v in get_settings().__dict__.items()}
