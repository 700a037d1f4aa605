"""The beat-equivalent safety scan as a process of its own: `timeouts.dispatch.scan.scan()` every INTERVAL s.

    python -m benchmarks.scan_loop --interval 5

Fixed-rate ticks, like beat: a scan that overruns its interval is followed at once by the next one.
Each scan stops after INTERVAL seconds (as the Celery task does), leaving the rest to the next one.
"""

import argparse
import logging
import signal
import threading
import time

logger = logging.getLogger("benchmarks.scan_loop")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, required=True)
    args = parser.parse_args(argv)

    import django

    django.setup()
    from django.db import close_old_connections

    from timeouts.dispatch.scan import scan

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    tick = time.monotonic()
    while not stop.is_set():
        try:
            scan(max_seconds=args.interval)
        except Exception:  # a scan that failed is retried at the next tick, as beat would
            logger.exception("scan failed")
            close_old_connections()
        tick = max(tick + args.interval, time.monotonic())
        stop.wait(max(0.0, tick - time.monotonic()))


if __name__ == "__main__":
    main()
