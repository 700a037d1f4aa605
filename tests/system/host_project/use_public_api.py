"""Every call of the documented public API, from a host project that only has the installed app."""

import importlib.metadata
import importlib.util
import os
import sysconfig
from datetime import UTC, datetime, timedelta

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostsite.settings")
django.setup()

from asgiref.sync import async_to_sync  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402
from shop.timeouts_handlers import CLOSED  # noqa: E402

import timeouts  # noqa: E402
import timeouts.celery  # noqa: E402
from timeouts.models import TimeoutTask  # noqa: E402

assert timeouts.__file__.startswith(sysconfig.get_paths()["purelib"]), f"not the installed wheel: {timeouts.__file__}"
assert importlib.metadata.version("django-timeouts") == timeouts.__version__
call_command("check", fail_level="ERROR")
call_command("migrate", verbosity=0)
Status = TimeoutTask.Status
now = datetime.now(UTC)

task = TimeoutTask.objects.schedule("order.close", biz_id=42, at=now - timedelta(seconds=1),
                                    attribute={"reason": "unpaid"})
assert (task.status, task.biz_id, task.max_attempts, task.ttr) == (Status.PENDING, "42", 3, 30)
later = timeouts.schedule("order.close", 43, delay=timedelta(minutes=30), on_conflict="error")
try:
    timeouts.schedule("order.close", 43, delay=60, on_conflict="error")
    raise AssertionError("conflict expected")
except timeouts.TaskConflict:
    pass
assert TimeoutTask.objects.schedule("order.close", 43, delay=5, on_conflict="keep").job_id == later.job_id
assert TimeoutTask.objects.bulk_schedule([{"biz_type": "order.close", "biz_id": i, "delay": 3600}
                                          for i in range(5)]) == 5
with transaction.atomic():
    TimeoutTask.objects.schedule("order.close", "rolled-back", delay=-1)
    transaction.set_rollback(True)
assert not TimeoutTask.objects.filter(biz_id="rolled-back").exists()
for bad in ({"at": datetime(2030, 1, 1)}, {"delay": 1, "attribute": {"x": float("nan")}}):
    try:
        timeouts.schedule("order.close", 1, **bad)
        raise AssertionError(f"{bad} must be rejected")
    except timeouts.TimeoutsError as exc:
        assert isinstance(exc, ValueError)
assert later.reschedule(delay=timedelta(hours=2)) is True
assert later.cancel() is True and later.cancel() is False
assert later.requeue() is True and later.status == Status.PENDING
assert timeouts.cancel("order.close", 0) is True
assert TimeoutTask.objects.cancel("order.close", 1) == 1
assert set(TimeoutTask.objects.due()) == {task, later}
assert TimeoutTask.objects.pending().count() == 5 and not TimeoutTask.objects.dead().exists()
assert timeouts.reschedule("order.close", 2, delay=timedelta(hours=2)) is True
assert timeouts.requeue("order.close", 2) is False  # it waits already
try:
    timeouts.reschedule("order.clsoe", 2, delay=1)
    raise AssertionError("a biz_type nothing handles must be refused")
except timeouts.UnknownBizType:
    pass
assert async_to_sync(timeouts.acancel)("order.close", 3) is True
assert async_to_sync(timeouts.aschedule)("order.close", 3, delay=3600).biz_id == "3"
assert TimeoutTask.objects.pending().count() == 5

from shop.jobs import order_total  # noqa: E402

import timeouts.backends  # noqa: E402

job = order_total.enqueue(42, [1, 2])
kept_back = order_total.using(run_after=now + timedelta(hours=1)).enqueue(43, [])
assert timeouts.backends.cancel(kept_back.id) is True
try:
    order_total.enqueue(44, [object()])
    raise AssertionError("arguments JSON cannot carry must be rejected")
except timeouts.TimeoutsError:
    pass

from timeouts.tasks import maintain, scan  # noqa: E402

scan.apply()  # the safety scan; with an eager Celery app the handlers run inline
job.refresh()
assert job.return_value == {"order": 42, "total": 3} and order_total.get_result(job.id).attempts == 1
assert order_total.get_result(kept_back.id).status == "FAILED"
assert sorted(CLOSED) == [("42", {"reason": "unpaid"}), (str(later.biz_id), {})], CLOSED
task.refresh_from_db()
assert task.status == Status.DONE and task.lateness >= timedelta(0)
maintain.apply()
assert set(timeouts.celery.beat_schedule()) == {"timeouts.scan", "timeouts.maintain"}
from hostsite.celery import app  # noqa: E402

assert {"timeouts.scan", "timeouts.maintain"} <= set(app.conf.beat_schedule)  # merged by setup(app)
# Installed without [prometheus]: the metrics view says what to install rather than fail.
from timeouts.metrics import metrics_view  # noqa: E402

assert importlib.util.find_spec("prometheus_client") is None
response = metrics_view(None)
assert response.status_code == 501 and b'pip install "django-timeouts[prometheus]"' in response.content
print("PUBLIC API OK")
