"""Create demo orders whose `order.close` timeouts fire a few seconds later, pay some of them (which
cancels their timeout), and optionally watch the timeouts fire and print how late each one started.

    python manage.py demo_orders                      # 6 orders, due in 3, 5, 7, ... seconds
    python manage.py demo_orders --watch 30 --check   # ... then wait for them; fail unless all went right
"""

import statistics
import time

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

import timeouts
from project.orders.models import Order
from timeouts.models import TimeoutTask


def hms(moment):
    return moment.strftime("%H:%M:%S.%f")[:-3]


class Command(BaseCommand):
    help = "Create demo orders with timeouts that close them unless paid; optionally watch them fire."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=6, help="orders to create (default 6)")
        parser.add_argument("--delay", type=float, default=3.0, help="seconds until the first timeout (default 3)")
        parser.add_argument("--step", type=float, default=2.0, help="seconds between timeouts (default 2)")
        parser.add_argument("--pay-every", type=int, default=3,
                            help="pay every Nth order right away, which cancels its timeout (default 3; 0: none)")
        parser.add_argument("--wait-for-worker", type=float, default=0, metavar="SECONDS",
                            help="first wait until a Celery worker answers a ping")
        parser.add_argument("--watch", type=float, default=0, metavar="SECONDS",
                            help="then print each timeout as it fires, for at most this long")
        parser.add_argument("--check", action="store_true",
                            help="exit non-zero unless every unpaid order was closed by its handler and "
                                 "every paid order's timeout was cancelled")

    def handle(self, *args, **options):
        if options["wait_for_worker"]:
            self.wait_for_worker(options["wait_for_worker"])
        orders = self.create(options)
        if options["watch"]:
            try:
                self.watch(orders, options["watch"])
            except KeyboardInterrupt:
                self.stdout.write("\n(stopped watching)")
                return
        if options["check"]:
            self.verify(orders)

    def wait_for_worker(self, seconds):
        from project.celery import app

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if app.control.ping(timeout=1.0):
                return
        raise CommandError(f"no Celery worker answered within {seconds:g} s")

    def create(self, options):
        """Each order and its timeout are created in one transaction: both exist, or neither."""
        orders = []  # (order, task)
        for i in range(options["count"]):
            delay = options["delay"] + i * options["step"]
            with transaction.atomic():
                order = Order.objects.create()
                task = TimeoutTask.objects.schedule(
                    "order.close", order.pk, delay=delay, attribute={"reason": "unpaid", "demo": True}
                )
            orders.append((order, task))
            self.stdout.write(f"order #{order.pk}: created, timeout job {task.job_id} due at "
                              f"{hms(task.action_time)} UTC (in {delay:g} s)")
        for n, (order, _task) in enumerate(orders, start=1):
            if options["pay_every"] and n % options["pay_every"] == 0:
                with transaction.atomic():
                    Order.objects.filter(pk=order.pk).update(paid=True, status=Order.Status.PAID)
                    cancelled = timeouts.cancel("order.close", order.pk)
                outcome = "its timeout cancelled" if cancelled else "no timeout left to cancel"
                self.stdout.write(f"order #{order.pk}: paid -> {outcome}")
        self.stdout.flush()
        return orders

    def watch(self, orders, seconds):
        job_ids = [task.job_id for _, task in orders]
        waiting = set(job_ids)
        deadline = time.monotonic() + seconds
        self.stdout.write(f"Watching {len(job_ids)} timeouts (at most {seconds:g} s) ...")
        self.stdout.flush()
        while waiting and time.monotonic() < deadline:
            for task in TimeoutTask.objects.filter(job_id__in=waiting):
                if task.status == TimeoutTask.Status.CANCELLED:
                    self.stdout.write(f"  cancelled  order #{task.biz_id}  job {task.job_id}: never ran (order paid)")
                elif task.status in (TimeoutTask.Status.DONE, TimeoutTask.Status.DEAD):
                    status = Order.objects.get(pk=task.biz_id).status
                    self.stdout.write(
                        f"  FIRED      order #{task.biz_id}  job {task.job_id}: due {hms(task.action_time)}, "
                        f"started {hms(task.started_at)}, late {task.lateness.total_seconds() * 1000:7.1f} ms"
                        f" -> order {status}"
                        + ("" if task.status == TimeoutTask.Status.DONE else f" (task DEAD: {task.last_error[-200:]})")
                    )
                else:
                    continue
                waiting.discard(task.job_id)
                self.stdout.flush()
            time.sleep(0.1)
        tasks = list(TimeoutTask.objects.filter(job_id__in=job_ids))
        lateness = [t.lateness.total_seconds() for t in tasks if t.started_at is not None]
        summary = f"{len(lateness)} fired, {sum(t.status == TimeoutTask.Status.CANCELLED for t in tasks)} cancelled"
        if lateness:
            summary += (f"; lateness min {min(lateness) * 1000:.0f} ms, median "
                        f"{statistics.median(lateness) * 1000:.0f} ms, max {max(lateness) * 1000:.0f} ms")
        if waiting:
            summary += f"; {len(waiting)} still waiting"
        self.stdout.write(summary)
        self.stdout.flush()

    def verify(self, orders):
        problems = []
        for order, task in orders:
            order.refresh_from_db()
            task = TimeoutTask.objects.get(job_id=task.job_id)
            if order.paid:
                if order.status != Order.Status.PAID or task.status != TimeoutTask.Status.CANCELLED:
                    problems.append(f"paid order #{order.pk}: status {order.status}, task {task.get_status_display()}")
            elif order.status != Order.Status.CLOSED or task.status != TimeoutTask.Status.DONE:
                problems.append(f"unpaid order #{order.pk}: status {order.status}, task {task.get_status_display()}")
            elif task.started_at < task.action_time:
                problems.append(f"order #{order.pk}: its timeout started before its action_time")
        if problems:
            raise CommandError("demo check failed:\n  " + "\n  ".join(problems))
        self.stdout.write(self.style.SUCCESS(f"Demo check passed: {len(orders)} orders as expected."))
