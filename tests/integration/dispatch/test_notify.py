"""The write side of the dispatcher's wake-ups: NOTIFY sent inside the writing transaction, only for
deadlines within NOTIFY_HORIZON, at most once per transaction for its earliest deadline."""

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection, transaction

from timeouts.models import TimeoutTask

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


@pytest.fixture
def listener():
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    conn = psycopg.connect(**params, autocommit=True)
    conn.execute('LISTEN "timeouts"')

    def received(raw=False):
        return [n.payload if raw else float(n.payload) for n in conn.notifies(timeout=0.3)]

    yield received
    conn.close()


def epoch(dt):
    return dt.timestamp()


def test_a_task_due_within_the_horizon_notifies_its_deadline(listener):
    task = TimeoutTask.objects.schedule("test.record", 1, delay=5)
    assert listener() == [pytest.approx(epoch(task.action_time), abs=1e-6)]


def test_outside_a_transaction_the_insert_notifies_itself_with_the_functions_payload(listener):
    # In autocommit, schedule() runs insert_task_autocommit, which calls pg_notify() itself; inside
    # a transaction insert_task goes through timeouts_notify_v1. Dispatchers must read the same text.
    at = datetime.now(UTC).replace(microsecond=123456) + timedelta(seconds=5)
    TimeoutTask.objects.schedule("test.record", 1, at=at)
    with transaction.atomic():
        TimeoutTask.objects.schedule("test.record", 2, at=at)
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM %s::timestamptz)::text", [at])
        expected = cursor.fetchone()[0]
    assert listener(raw=True) == [expected, expected]


def test_a_task_beyond_the_horizon_does_not_notify(listener):
    TimeoutTask.objects.schedule("test.record", 1, delay=3600)
    assert listener() == []


def test_a_rolled_back_schedule_never_notifies(listener):
    with pytest.raises(RuntimeError), transaction.atomic():
        TimeoutTask.objects.schedule("test.record", 1, delay=1)
        raise RuntimeError
    assert listener() == []


def test_one_notification_per_transaction_for_its_earliest_deadline(listener):
    now = datetime.now(UTC)
    with transaction.atomic():
        first = TimeoutTask.objects.schedule("test.record", 1, at=now + timedelta(seconds=1))
        for i in range(2, 20):
            TimeoutTask.objects.schedule("test.record", i, at=now + timedelta(seconds=i))
    assert listener() == [pytest.approx(epoch(first.action_time), abs=1e-6)]


def test_bulk_schedule_sends_one_notification(listener):
    now = datetime.now(UTC)
    items = [{"biz_type": "test.record", "biz_id": i, "at": now + timedelta(seconds=30 - i / 100)} for i in range(2000)]
    TimeoutTask.objects.bulk_schedule(items)
    assert listener() == [pytest.approx(epoch(now + timedelta(seconds=30 - 1999 / 100)), abs=1e-6)]


def test_reschedule_and_requeue_notify(listener):
    task = TimeoutTask.objects.schedule("test.record", 1, delay=3600)
    assert listener() == []
    task.reschedule(delay=2)
    assert listener() == [pytest.approx(epoch(task.action_time), abs=1e-6)]
    task.cancel()
    task.requeue()
    assert listener() == [pytest.approx(epoch(task.action_time), abs=1e-6)]


def debounce(biz_id, seconds, **options):
    return TimeoutTask.objects.schedule("test.record", biz_id, delay=timedelta(seconds=seconds),
                                        on_conflict="debounce", **options)


def test_a_debounce_notifies_only_when_it_moves_a_deadline_earlier_within_the_horizon(listener):
    created = debounce("k", 20)
    assert listener() == [pytest.approx(epoch(created.action_time), abs=1e-6)]  # a new task, as any
    debounce("k", 30)
    debounce("k", 40, max_wait=timedelta(seconds=35))  # later, to the cap
    assert listener() == []  # later: the dispatchers find it when they next read the nearest deadline
    sooner = debounce("k", 5)
    assert listener() == [pytest.approx(epoch(sooner.action_time), abs=1e-6)]
    far = debounce("far", 7200)
    assert listener() == []
    debounce("far", 3600)  # earlier, but beyond the horizon
    assert listener() == []
    assert far.job_id == debounce("far", 4000).job_id


def test_debounces_inside_a_transaction_notify_at_commit_as_inserts_do(listener):
    debounce("a", 3600)
    debounce("b", 3600)
    with transaction.atomic():
        first = debounce("a", 5)
        debounce("b", 10)  # later than the deadline this transaction announced already
        debounce("c", 20)
    assert listener() == [pytest.approx(epoch(first.action_time), abs=1e-6)]


def test_a_batch_of_debounces_notifies_once_for_its_earliest_new_deadline(listener):
    moved = debounce("moved", 3600)
    later = debounce("later", 10)
    assert len(listener()) == 1
    items = [{"biz_type": "test.record", "biz_id": biz_id, "delay": timedelta(seconds=seconds),
              "on_conflict": "debounce"} for biz_id, seconds in (("moved", 8), ("later", 50), ("new", 9))]
    assert TimeoutTask.objects.bulk_schedule(items) == 1
    moved.refresh_from_db()
    assert listener() == [pytest.approx(epoch(moved.action_time), abs=1e-6)]
    assert later.job_id == TimeoutTask.objects.get(biz_id="later").job_id
    assert TimeoutTask.objects.bulk_schedule(items[1:2]) == 0  # "later" moved later again: no NOTIFY
    assert listener() == []
