"""The scale scenario's churn: one process that schedules tasks at a steady rate through the public
API and cancels most of them before they fall due, as a timeout center's callers do (an order paid
before its payment timeout, a session closed before it expires).

    python -m benchmarks.churn_writer --rate 100 --ahead 30 --cancel-share 0.8

Each task is scheduled with timeouts.schedule() (the default on_conflict), due `ahead` seconds
later; the share `cancel_share` of them is cancelled with timeouts.cancel() between a fifth and
four fifths of the way to its due time; the others fall due and run (a no-op handler). Which
tasks are cancelled, and when, is spread evenly (cancelled(), cancel_after()), not drawn at random,
so every run makes the same calls.

It sets up and warms its connection, says `ready`, starts on a line on its standard input, goes on
until its standard input ends, and prints one JSON line: what it did and in how many seconds.
"""

import argparse
import heapq
import json
import math
import os
import select
import sys
import time

GOLDEN = (math.sqrt(5) - 1) / 2
ROOT2 = math.sqrt(2) - 1
WARM_CALLS = 10


def _fraction(k: int, step: float) -> float:
    return (k * step) % 1.0


def cancelled(k: int, share: float) -> bool:
    """Whether the k-th task is cancelled: `share` of any run of consecutive tasks, evenly."""
    return _fraction(k, GOLDEN) < share


def cancel_after(k: int, ahead: float) -> float:
    """Seconds from scheduling the k-th task to cancelling it: between 1/5 and 4/5 of `ahead`."""
    return ahead * (0.2 + 0.6 * _fraction(k, ROOT2))


def call_times(took: dict) -> dict:
    """{call}_ms (the mean) and {call}_p99_ms of each kind of call, from the seconds each took."""
    out = {}
    for call, seconds in took.items():
        ordered = sorted(seconds)
        out[f"{call}_ms"] = round(1000.0 * sum(ordered) / len(ordered), 3) if ordered else None
        out[f"{call}_p99_ms"] = (round(1000.0 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3)
                                 if ordered else None)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, required=True, help="tasks scheduled per second")
    parser.add_argument("--ahead", type=float, required=True, help="seconds from scheduling to due")
    parser.add_argument("--cancel-share", type=float, required=True, help="of the tasks, cancelled before due")
    args = parser.parse_args(argv)

    import django

    django.setup()
    import timeouts

    from .handlers import CHURN
    from .held_process import say, wait_for_go

    prefix = f"churn-{os.getpid()}-"
    for call in range(WARM_CALLS):
        timeouts.schedule(CHURN, f"warm-{prefix}{call}", delay=args.ahead)
        timeouts.cancel(CHURN, f"warm-{prefix}{call}")
    wait_for_go()

    interval, pending = 1.0 / args.rate, []
    scheduled = cancelled_count = missed = 0
    behind = 0.0
    took = {"schedule": [], "cancel": []}  # seconds each call took, as its caller waits for it
    started = time.monotonic()
    while True:
        now = time.monotonic()
        while started + scheduled * interval <= now:
            k = scheduled
            before = time.perf_counter()
            timeouts.schedule(CHURN, f"{prefix}{k}", delay=args.ahead)
            took["schedule"].append(time.perf_counter() - before)
            if cancelled(k, args.cancel_share):
                heapq.heappush(pending, (started + k * interval + cancel_after(k, args.ahead), k))
            scheduled += 1
            behind = max(behind, now - (started + k * interval))
        now = time.monotonic()
        while pending and pending[0][0] <= now:
            _, k = heapq.heappop(pending)
            before = time.perf_counter()
            found = timeouts.cancel(CHURN, f"{prefix}{k}")
            took["cancel"].append(time.perf_counter() - before)
            if found:
                cancelled_count += 1
            else:
                missed += 1
        next_at = min(started + scheduled * interval, pending[0][0] if pending else math.inf)
        wait = max(0.0, next_at - time.monotonic())
        if select.select([sys.stdin], [], [], wait)[0] and not sys.stdin.readline():
            break  # the bench closed our standard input: stop
    seconds = time.monotonic() - started
    say(json.dumps({"scheduled": scheduled, "cancelled": cancelled_count, "cancel_missed": missed,
                    "not_yet_cancelled": len(pending), "seconds": round(seconds, 2),
                    "max_behind_s": round(behind, 3), **call_times(took)}))


if __name__ == "__main__":
    main()
