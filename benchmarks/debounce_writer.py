"""One writer of the debounce scenario (benchmarks/debounce.py): its share of the calls, made one
after another on one connection, each in its own autocommit transaction as a web request makes it.

    python -m benchmarks.debounce_writer --mode debounce --writer 0 --writers 4 --keys 10000 \
        --calls 10 --block 250 --delay 5 --max-wait 6

It sets up, makes a few calls of its own (the path is warm before the measured calls), says
`ready` (a line), makes its calls when a line comes on its standard input, and prints one JSON
line: how many calls it made, and when it started and finished them (Unix time).
"""

import argparse
import json
import time
from datetime import timedelta

WARM_CALLS = 20


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("debounce", "replace"), required=True, help="on_conflict")
    parser.add_argument("--writer", type=int, required=True, help="this writer's number, from 0")
    parser.add_argument("--writers", type=int, required=True)
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--calls", type=int, required=True, help="calls per key, over all the writers")
    parser.add_argument("--block", type=int, required=True, help="keys whose calls are made together")
    parser.add_argument("--delay", type=float, required=True, help="seconds: each call's delay")
    parser.add_argument("--max-wait", type=float, default=None, help="seconds (debounce only)")
    args = parser.parse_args(argv)

    import django

    django.setup()
    from timeouts.models import TimeoutTask

    from .debounce import plan
    from .handlers import NOOP, PROBE
    from .held_process import say, wait_for_go

    options = {"on_conflict": args.mode, "delay": timedelta(seconds=args.delay)}
    if args.max_wait is not None:
        options["max_wait"] = timedelta(seconds=args.max_wait)
    calls = plan(args.keys, args.calls, args.writers, args.block, args.writer)
    for call in range(WARM_CALLS):  # on keys of the probe handler, which the results leave out
        TimeoutTask.objects.schedule(PROBE, f"warm-{args.writer}-{call % 2}", **options)
    wait_for_go()
    started = time.time()
    for _round, key in calls:
        TimeoutTask.objects.schedule(NOOP, key, **options)
    finished = time.time()
    say(json.dumps({"writer": args.writer, "calls": len(calls), "started": started, "finished": finished}))


if __name__ == "__main__":
    main()
