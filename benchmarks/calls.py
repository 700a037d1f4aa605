"""Calls of a Celery task with an eta or a countdown, made from a process of its own, as a host
project makes them: one `apply_async()` after another, each in its own autocommit transaction.

    python -m benchmarks.calls --task benchmarks.durable --n 2000 --lead 5 --window 10 --seed 1

DurableTask stores its calls through Django's `default` database. The bench's children have the
bench's database there (DATABASE_URL), the bench's own process has the project's: so the calls,
DurableTask's and plain Celery's alike, are made here, on the project's Celery app.

With --eta the due times are `due_times("spread", ...)` from a base `lead` seconds ahead, in random
order; the body gets (key, due time) and records both. With --countdown every call has that
countdown (0: none, a plain message). --rate R makes the calls at R per second instead of as fast
as they go. --probe K first sends K calls due almost at once (negative keys) and waits until they
ran: the path from apply_async() to the worker is warm before the measured calls. Prints one JSON
line: the base of the due times (ISO), calls per second, and the calls that returned after their
due time.

With --hold, the process says `ready` (a line) once it is set up and warm, makes its calls when a
line comes on its standard input, prints its JSON line, and exits when its standard input closes:
whoever measures its CPU time and its database session's sees both from before the first call to
after the last call ran.
"""

import argparse
import json
import time
from datetime import UTC, datetime, timedelta

# A Django task (benchmarks.django_task) through the tasks framework's backend: enqueue() with run_after.
DJANGO_TASK = "django_task"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app", default="project", help="the Celery app, as for `celery -A`")
    parser.add_argument("--task", required=True, help="the task's name (a task of benchmarks.handlers)")
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--lead", type=float, default=5.0, help="seconds from now to the first due time")
    parser.add_argument("--window", type=float, default=0.0, help="seconds over which the calls fall due")
    parser.add_argument("--countdown", type=float, default=None, help="every call with this countdown instead")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--probe", type=int, default=0)
    parser.add_argument("--probe-timeout", type=float, default=90.0)
    parser.add_argument("--rate", type=float, default=0.0, help="calls per second (0: as fast as they go)")
    parser.add_argument("--hold", action="store_true", help="wait for a line before the calls, and for EOF after")
    args = parser.parse_args(argv)

    import django

    django.setup()
    from celery.app.utils import find_app

    find_app(args.app)  # the project's app, on the bench's broker (CELERY_BROKER_URL), becomes current
    from . import handlers
    from .held_process import say, wait_for_go, wait_for_stop
    from .progress import Progress
    from .workload import due_times

    if args.task == DJANGO_TASK:
        from .django_task import record_start

        def call(key, at):
            record_start.using(run_after=at).enqueue(key, at.isoformat())

        def probe(key):
            record_start.enqueue(key, "epoch")
    else:
        task = {handlers.DURABLE_TASK: handlers.durable, handlers.DIRECT_TASK: handlers.direct}[args.task]

        def call(key, at):
            if args.countdown is None:
                task.apply_async((key, at.isoformat()), eta=at)
            else:
                task.apply_async((key, at.isoformat()), countdown=args.countdown)

        def probe(key):
            task.apply_async((key, "epoch"), countdown=0.3)

    if args.probe:
        _probe(probe, args.probe, args.probe_timeout)
    if args.hold:
        wait_for_go()

    base = datetime.now(UTC) + timedelta(seconds=args.lead)
    if args.countdown is None:
        times = due_times("spread", args.n, base=base, window=args.window, seed=args.seed)
    else:
        times = [datetime.now(UTC) + timedelta(seconds=args.countdown)] * args.n
    progress = Progress(f"{args.task}: {args.n:,} calls", args.n)
    over, behind = 0, 0.0
    started = time.perf_counter()
    for key, at in enumerate(times):
        if args.rate > 0:
            behind = max(behind, _pace(started + key / args.rate))
            if args.countdown is not None:
                at = datetime.now(UTC) + timedelta(seconds=args.countdown)
        call(key, at)
        if args.countdown is None and time.time() > at.timestamp():
            over += 1
        if key % 500 == 0:
            progress.update(key)
    seconds = time.perf_counter() - started
    progress.finish(args.n)
    say(json.dumps({"base": base.isoformat(), "n": args.n, "sched_per_s": round(args.n / seconds),
                    "sched_overrun": over, "sched_behind_ms": round(behind * 1000.0, 1)}))
    if args.hold:
        wait_for_stop()


def _pace(when) -> float:
    """Sleep until `when` (time.perf_counter()); how far behind it this call is."""
    wait = when - time.perf_counter()
    if wait > 0:
        time.sleep(wait)
        return 0.0
    return -wait


def _probe(probe, count, timeout):
    from django.db import connection

    for key in range(1, count + 1):
        probe(-key)
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT count(*) FROM timeouts_bench_start WHERE job_id < 0")
            if cursor.fetchone()[0] >= count:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the {count} probe calls did not run within {timeout:.0f} s")
            time.sleep(0.1)
        cursor.execute("DELETE FROM timeouts_bench_start WHERE job_id < 0")


if __name__ == "__main__":
    main()
