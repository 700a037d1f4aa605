"""The admin benchmark: how fast the TimeoutTask admin answers on a table of N rows.

`run(rows)` creates a database of its own (never the default one), migrates it, fills the
partitioned table with `rows` tasks spread over ~30 daily partitions (15 days back, today, 14
ahead) with a plausible mix of statuses and biz_types (see fill()), VACUUM ANALYZEs it, and then
times the changelist (default, each filter, search, both orders, deep pages) and the detail page
with Django's test Client as a logged-in superuser: the median of `repeats` requests after one
warm-up each. It drops the database at the end unless `keep`.

    DJANGO_SETTINGS_MODULE=project.settings python -m benchmarks.admin_scenario --rows 20000000

Loading is one INSERT .. SELECT generate_series per day with the secondary indexes dropped and
rebuilt afterwards (much faster than maintaining them row by row); the rebuild times are reported
too, as they are what adding each index to a table of that size would cost.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import psycopg

from timeouts.states import Status, substitute

DEFAULT_NAME = "timeouts_admin_bench"
DAYS_BACK, DAYS_AHEAD = 15, 14
BIZ_TYPES = (("order.close", 6000), ("reservation.expire", 2500), ("webhook.retry", 1000),
             ("payment.check", 499), ("audit.rare", 1))  # per 10,000
TARGET_MS = 300.0

# One row per g in [lo, hi): action_time spread evenly over the day, status by where it lies
# relative to now (r: a hash of g in 0..9999). Past: 30% cancelled, 0.05% dead, the rest done;
# the last 10 minutes also hold a 2% backlog of overdue pending tasks and, in the last 2
# minutes, dispatched and running ones. Future: 25% cancelled early, the rest pending.
FILL_SQL = substitute("""
INSERT INTO timeouts_task (biz_type, biz_id, status, action_time, run_at, attribute, attempts, max_attempts, ttr,
                           last_error, lease_until, created_at, modified_at, dispatched_at, started_at, finished_at)
SELECT biz_type, biz_id, status, t, t, attribute,
       CASE status WHEN :DEAD THEN 16 WHEN :DONE THEN 1 + (r %% 50 = 0)::int WHEN :RUNNING THEN 1 ELSE 0 END, 16, 60,
       CASE WHEN status = :DEAD THEN 'Traceback (most recent call last):' || E'\\n' || '  File "handlers.py", line 12'
            || E'\\n' || 'RuntimeError: upstream said 503' ELSE '' END,
       CASE WHEN status IN (:DISPATCHED, :RUNNING) THEN %(now)s + interval '60 s' END,
       t - interval '30 min', least(t + late, %(now)s),
       CASE WHEN status IN (:DISPATCHED, :DONE, :RUNNING, :DEAD) THEN t END,
       CASE WHEN status IN (:DONE, :RUNNING, :DEAD) THEN t + late END,
       CASE WHEN status IN (:DONE, :DEAD) THEN t + late + interval '20 ms'
            WHEN status = :CANCELLED THEN least(t - interval '5 min', %(now)s) END
FROM (
    SELECT g, r, t, late,
           {biz_type} AS biz_type,
           ((g * 2654435761) %% 1000000007)::text AS biz_id,
           jsonb_build_object('reason', 'unpaid', 'n', g %% 100) AS attribute,
           CASE WHEN t > %(now)s THEN (CASE WHEN r < 2500 THEN :CANCELLED ELSE :PENDING END)
                WHEN t > %(now)s - interval '2 min' AND r < 100
                    THEN (CASE WHEN r < 50 THEN :RUNNING ELSE :DISPATCHED END)
                WHEN t > %(now)s - interval '10 min' AND r < 300 THEN :PENDING
                WHEN r < 5 THEN :DEAD WHEN r < 3005 THEN :CANCELLED ELSE :DONE END AS status
    FROM (SELECT g, (g * 40503) %% 10000 AS r,
                 %(lower)s + (g - %(lo)s) * (interval '1 day' / (%(hi)s - %(lo)s)) AS t,
                 interval '1 ms' * (5 + (g * 13) %% 300) AS late
          FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS g) AS base
) AS rows
""")


def _biz_type_case():
    """CASE expression picking a biz_type by share (per 10,000) from a hash of g."""
    branches, upto = [], 0
    for name, share in BIZ_TYPES:
        upto += share
        branches.append(f"WHEN (g * 48271 %% 2147483647) %% 10000 < {upto} THEN '{name}'")
    return "CASE " + " ".join(branches) + " END"


def _say(message):
    print(f"[admin bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _params(settings_dict, dbname):
    out = {"dbname": dbname, "host": settings_dict.get("HOST") or None, "port": settings_dict.get("PORT") or None,
           "user": settings_dict.get("USER") or None, "password": settings_dict.get("PASSWORD") or None}
    return {key: value for key, value in out.items() if value is not None}


@contextmanager
def own_database(name, keep=False, reuse=False):
    """Point Django's default alias at a new database `name` for the duration; drop it after unless
    `keep`. With `reuse`, an existing database of that name is used as it is (yields True then)."""
    from django.db import connections

    connection = connections["default"]
    original = dict(connection.settings_dict)
    if name == original["NAME"]:
        raise ValueError(f"the admin bench needs a database of its own, not {name!r}")
    with psycopg.connect(**_params(original, "postgres"), autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None
        reused = reuse and exists
        if not reused:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')
    connection.close()
    connection.settings_dict["NAME"] = name
    try:
        yield reused
    finally:
        connection.close()
        connection.settings_dict["NAME"] = original["NAME"]
        if not keep:
            with psycopg.connect(**_params(original, "postgres"), autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fill(connection, rows, *, now=None, rebuild_indexes=True, log=_say) -> dict:
    """Fill timeouts_task with `rows` tasks over DAYS_BACK + 1 + DAYS_AHEAD daily partitions
    (creating the missing ones). With `rebuild_indexes`, the secondary indexes and the primary key
    are dropped for the load and built again after it. Returns timings (seconds) of the load, the
    index builds and VACUUM ANALYZE."""
    from timeouts.storage import partition_ddl, partitions

    now = now or datetime.now(UTC)
    today = partitions.bucket_start(now, "day")
    days = [today + timedelta(days=d) for d in range(-DAYS_BACK, DAYS_AHEAD + 1)]
    existing = {p.lower for p in partitions.list_partitions(connection)}
    for day in days:
        if day not in existing:
            partition_ddl.create_partition(connection, partitions.partition_name(day, "day"), day,
                                           day + timedelta(days=1))
    timings = {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
                       "AND tablename = 'timeouts_task' AND indexname <> 'timeouts_task_pkey'")
        indexes = cursor.fetchall() if rebuild_indexes else []
        for name, _ in indexes:
            cursor.execute(f'DROP INDEX "{name}"')
        if rebuild_indexes:
            cursor.execute("ALTER TABLE timeouts_task DROP CONSTRAINT timeouts_task_pkey")
        cursor.execute("SET synchronous_commit = off")
        started = time.monotonic()
        statement = FILL_SQL.replace("{biz_type}", _biz_type_case())
        per_day = rows / len(days)
        for i, day in enumerate(days):
            lo, hi = round(i * per_day) + 1, round((i + 1) * per_day) + 1
            cursor.execute(statement, {"now": now, "lower": day, "lo": lo, "hi": hi})
            log(f"loaded {day:%Y-%m-%d}: {hi - lo:,} rows ({i + 1}/{len(days)})")
        timings["load_s"] = time.monotonic() - started
        cursor.execute("SET maintenance_work_mem = '1GB'")
        if rebuild_indexes:
            started = time.monotonic()
            cursor.execute("ALTER TABLE timeouts_task ADD PRIMARY KEY (job_id, action_time)")
            timings["index_timeouts_task_pkey_s"] = time.monotonic() - started
        for name, definition in indexes:
            started = time.monotonic()
            cursor.execute(definition.replace(" ON ONLY ", " ON "))
            timings[f"index_{name}_s"] = time.monotonic() - started
            log(f"rebuilt {name} in {timings[f'index_{name}_s']:.1f} s")
        started = time.monotonic()
        cursor.execute("VACUUM (ANALYZE) timeouts_task")
        timings["vacuum_analyze_s"] = time.monotonic() - started
        cursor.execute("RESET synchronous_commit; RESET maintenance_work_mem")
        cursor.execute("SELECT pg_size_pretty(sum(pg_total_relation_size(inhrelid))) FROM pg_inherits "
                       "WHERE inhparent = 'timeouts_task'::regclass")
        timings["table_size"] = cursor.fetchone()[0]
    return timings


def scenarios(connection):
    """(name, url) of every page timed; ids come from the data."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT job_id, biz_id FROM timeouts_task WHERE status = %s AND action_time <= now() "
                       "ORDER BY action_time DESC LIMIT 1", [Status.DEAD])
        dead_job, dead_biz = cursor.fetchone()
    base = "/admin/timeouts/timeouttask/"
    pages = [("changelist, default (newest first)", base), ("oldest first (o=5)", base + "?o=5"),
             ("page 2", base + "?p=2"), ("page 100 (the last offered)", base + "?p=100")]
    pages += [(f"status = {state.label.lower()}", f"{base}?status={state.value}") for state in
              (Status.PENDING, Status.DISPATCHED, Status.RUNNING, Status.DONE, Status.CANCELLED, Status.DEAD)]
    pages += [("status = pending, oldest first", f"{base}?status={Status.PENDING.value}&o=5"),
              ("status = done, oldest first", f"{base}?status={Status.DONE.value}&o=5")]
    pages += [(f"biz_type = {name}", f"{base}?biz_type={name}") for name in ("order.close", "audit.rare")]
    pages += [("biz_type with no task", f"{base}?biz_type=no.such.type")]
    pages += [(f"due: {value}", f"{base}?due={value}") for value in ("overdue", "next_hour", "today")]
    pages += [("dead + biz_type", f"{base}?status={Status.DEAD.value}&biz_type=order.close"),
              ("pending + biz_type", f"{base}?status={Status.PENDING.value}&biz_type=order.close"),
              ("pending + rare biz_type", f"{base}?status={Status.PENDING.value}&biz_type=audit.rare"),
              ("search: job id", f"{base}?q={dead_job}"), ("search: biz_id", f"{base}?q={dead_biz}"),
              ("detail page", f"{base}{dead_job}/change/")]
    return pages


def time_pages(pages, *, repeats=7, log=_say) -> list[dict]:
    from django.contrib.auth import get_user_model
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, override_settings

    user_model = get_user_model()
    user = user_model.objects.filter(username="bench").first() or user_model.objects.create_superuser(
        "bench", "bench@example.com", "bench")
    client = Client(SERVER_NAME="localhost")
    client.force_login(user)
    results = []
    with override_settings(DEBUG=False, ALLOWED_HOSTS=["localhost"]):
        for name, url in pages:
            reset_queries()  # each request clears the log when it starts: begin from an empty one
            with CaptureQueriesContext(connection) as queries:
                response = client.get(url)
            captured = list(queries.captured_queries)  # the next request clears the log
            if response.status_code != 200:
                raise RuntimeError(f"{url} answered {response.status_code}")
            samples = []
            for _ in range(repeats):
                started = time.perf_counter()
                client.get(url)
                samples.append((time.perf_counter() - started) * 1000)
            sql_ms = sum(float(q["time"]) for q in captured) * 1000
            results.append({"page": name, "url": url, "median_ms": statistics.median(samples),
                            "max_ms": max(samples), "queries": len(captured), "warmup_sql_ms": sql_ms})
            log(f"{name}: median {statistics.median(samples):.1f} ms ({len(captured)} queries)")
    return results


def machine() -> dict:
    import django

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "cpus": os.cpu_count(),
            "ram_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "python": platform.python_version(), "django": django.get_version(), "load_avg": load}


def run(rows, *, name=DEFAULT_NAME, repeats=7, keep=False, reuse=False, log=_say) -> dict:
    """Build the database (or, with `reuse`, take the one a `keep` run left) and time the pages."""
    from django.core.management import call_command
    from django.db import connection

    with own_database(name, keep=keep or reuse, reuse=reuse) as reused:
        timings = {}
        if not reused:
            log(f"migrating {name}")
            call_command("migrate", verbosity=0, interactive=False)
            log(f"filling with {rows:,} rows")
            timings = fill(connection, rows, log=log)
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            server = cursor.fetchone()[0]
            cursor.execute("SELECT count(*) FROM timeouts_task")
            rows = cursor.fetchone()[0]
        pages = time_pages(scenarios(connection), repeats=repeats, log=log)
    return {"rows": rows, "repeats": repeats, "postgres": server, "machine": machine(), "build": timings,
            "pages": pages}


def markdown(result) -> str:
    m = result["machine"]
    title = (f"{result['rows']:,} rows, PostgreSQL {result['postgres'].split()[0]}, Django {m['django']}, "
             f"Python {m['python']}, {m['cpus']} CPUs, {m['ram_gb']} GB RAM, {m['date']}; median of "
             f"{result['repeats']} requests after a warm-up, target {TARGET_MS:.0f} ms.")
    lines = [title, "",
             "| page | median ms | max ms | queries | SQL ms (warm-up) |", "|---|---:|---:|---:|---:|"]
    for p in result["pages"]:
        flag = "" if p["median_ms"] < TARGET_MS else " **over target**"
        lines.append(f"| {p['page']} | {p['median_ms']:.1f}{flag} | {p['max_ms']:.1f} | {p['queries']} | "
                     f"{p['warmup_sql_ms']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--name", default=DEFAULT_NAME, help="the database to create (and drop)")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--reuse", action="store_true", help="time the pages on the database a --keep run left")
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args(argv)
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    result = run(args.rows, name=args.name, repeats=args.repeats, keep=args.keep, reuse=args.reuse)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
    print(markdown(result))


if __name__ == "__main__":
    main()
