"""`manage.py timeouts_dispatcher`: run the low-latency dispatcher until SIGTERM or SIGINT."""

import signal
import threading

from django.core.management.base import BaseCommand

from timeouts.dispatch import dispatcher


class Command(BaseCommand):
    help = ("Hand tasks to Celery the moment they are due: LISTEN for new deadlines and sleep until the "
            "nearest one, on every shard. Any number may run at once. Stops cleanly on SIGTERM or SIGINT.")

    def add_arguments(self, parser):
        parser.add_argument("--lead", type=float,
                            help="Seconds ahead of a deadline to publish (default: DISPATCH_LEAD).")
        parser.add_argument("--batch-size", type=int, help="Tasks claimed per query (default: SCAN_BATCH_SIZE).")
        parser.add_argument("--keepalive", type=float, default=dispatcher.KEEPALIVE_INTERVAL,
                            help="Seconds between nearest-deadline reads when idle (also the keepalive).")
        parser.add_argument("--publish-timeout", type=float, default=dispatcher.PUBLISH_TIMEOUT,
                            help="Seconds a chunk of messages may take to reach the broker before its claims "
                                 "are released.")

    def handle(self, *args, lead, batch_size, keepalive, publish_timeout, **options):
        stop = threading.Event()
        # Only set the event: the loop stops between steps, after publishing (or releasing) what it
        # claimed, so nothing is left claimed without a message.
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            dispatcher.run_on_every_shard(stop, lead=lead, batch_size=batch_size, keepalive_interval=keepalive,
                                          publish_timeout=publish_timeout)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
