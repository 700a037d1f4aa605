"""Three shards (three test databases): every operation on one task or one business key goes to the
one shard that holds it, job_ids are unique across shards and name their shard, the scan and the
maintenance cover every shard, and a shard that is down holds back only its own tasks."""

import io
import itertools
import json
import logging
import threading
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connections, transaction

import timeouts
import timeouts.celery
from tests.support.shards import ALIASES, key_on, three_shards, unreachable  # noqa: F401 (an autouse fixture)
from tests.support.worker_steps import in_thread
from timeouts import checks, tasks
from timeouts.backends import cancel as backend_cancel
from timeouts.dispatch.claiming import claim_due, release
from timeouts.dispatch.scan import scan
from timeouts.errors import InvalidTime, ShardOutsideTransaction, TaskConflict
from timeouts.models import TimeoutTask
from timeouts.storage import shards
from timeouts.storage.partitions import list_partitions
from timeouts.store import worker_connection
from timeouts.store.recovery import recover_expired

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True, databases=ALIASES), pytest.mark.timeout(120)]


def where(job_id) -> list[str]:
    """The shards that hold a task of this job_id."""
    return [alias for alias in ALIASES if TimeoutTask.objects.using(alias).filter(job_id=job_id).exists()]


def in_an_hour():
    return datetime.now(UTC) + timedelta(hours=1)


def test_a_task_lives_on_the_shard_of_its_key_and_its_job_id_says_which():
    for alias in ALIASES:
        task = timeouts.schedule("test.record", key_on(alias), at=in_an_hour())
        assert task._state.db == alias
        assert where(task.job_id) == [alias]
        assert shards.alias_of_job(task.job_id) == alias
        assert task.job_id % shards.SLOTS == shards.slot_of(task.biz_id)


def test_job_ids_are_unique_across_shards():
    # Each shard's sequence starts at 1: the slot in the low bits keeps their job_ids apart.
    made = [timeouts.schedule("test.record", f"unique-{n}", delay=3600) for n in range(90)]
    assert {task._state.db for task in made} == set(ALIASES)
    assert len({task.job_id for task in made}) == len(made)
    assert all(shards.alias_of_job(task.job_id) == task._state.db for task in made)


def test_the_database_computes_the_slot_as_python_does():
    with connections["shard_b"].cursor() as cursor:
        cursor.execute("SELECT b, ('x' || left(md5(b), 8))::bit(32)::int & 1023 FROM unnest(%s::text[]) AS b",
                       [[f"k{n}" for n in range(200)]])
        assert all(slot == shards.slot_of(biz_id) for biz_id, slot in cursor.fetchall())


def test_cancel_reschedule_and_requeue_act_on_the_tasks_shard():
    biz_id = key_on("shard_c")
    task = timeouts.schedule("test.record", biz_id, at=in_an_hour())
    assert task.reschedule(delay=7200)
    assert TimeoutTask.objects.using("shard_c").get(job_id=task.job_id).action_time == task.action_time
    assert task.cancel()
    assert task.requeue()
    assert TimeoutTask.objects.using("shard_c").get(job_id=task.job_id).status == Status.PENDING
    assert timeouts.cancel("test.record", biz_id) == 1
    assert TimeoutTask.objects.using("shard_c").get(job_id=task.job_id).status == Status.CANCELLED
    assert [TimeoutTask.objects.using(alias).count() for alias in ALIASES] == [0, 0, 1]


def test_at_most_one_waiting_task_per_key_holds_on_the_keys_shard():
    biz_id = key_on("shard_b")
    first = timeouts.schedule("test.record", biz_id, at=in_an_hour(), on_conflict="error")
    with pytest.raises(TaskConflict, match=str(first.job_id)):
        timeouts.schedule("test.record", biz_id, at=in_an_hour(), on_conflict="error")
    replaced = timeouts.schedule("test.record", biz_id, at=in_an_hour(), on_conflict="replace")
    assert replaced._state.db == "shard_b"
    assert sorted(TimeoutTask.objects.using("shard_b").values_list("status", flat=True)) == [
        Status.PENDING, Status.CANCELLED]


def test_bulk_schedule_puts_each_task_on_its_shard_or_stores_nothing():
    items = [{"biz_type": "test.record", "biz_id": f"bulk-{n}", "delay": 60} for n in range(60)]
    items.append({"biz_type": "test.record", "biz_id": key_on("shard_b", "bulk-keyed"), "delay": 60,
                  "on_conflict": "keep"})
    assert timeouts.bulk_schedule(items) == 61
    for alias in ALIASES:
        stored = TimeoutTask.objects.using(alias).values_list("job_id", "biz_id")
        assert stored and all(shards.place("test.record", biz_id).alias == alias == shards.alias_of_job(job_id)
                              for job_id, biz_id in stored)
    with pytest.raises(InvalidTime):
        timeouts.bulk_schedule([{"biz_type": "test.record", "biz_id": "more-1", "delay": 60},
                                {"biz_type": "test.record", "biz_id": "more-2", "at": datetime(2030, 1, 1)}])
    assert sum(TimeoutTask.objects.using(alias).count() for alias in ALIASES) == 61


def test_a_claim_says_its_shard_and_its_message_runs_the_task_there(starts):
    due = {alias: timeouts.schedule("test.record", key_on(alias), delay=0) for alias in ALIASES}
    for alias, task in due.items():
        with worker_connection.shared(alias):
            [claim] = claim_due(10)
        assert (claim.job_id, claim.shard) == (task.job_id, alias)
        assert claim.message_kwargs() == ({} if alias == "default" else {"shard": alias})
        assert tasks.run(*claim.message_args(), **claim.message_kwargs()) == "done"
        assert TimeoutTask.objects.using(alias).get(job_id=task.job_id).status == Status.DONE
    assert sorted(job_id for job_id, *_ in starts.all()) == sorted(task.job_id for task in due.values())


def test_claims_go_back_on_their_own_shards_from_a_thread_without_a_connection_of_its_own():
    made = {alias: timeouts.schedule("test.record", key_on(alias, "given-back"), delay=0) for alias in ALIASES}
    claims = []
    for alias in ALIASES:
        with worker_connection.shared(alias):
            claims += claim_due(10)
    assert sorted(claim.shard for claim in claims) == sorted(ALIASES)
    # As the dispatcher's publishing thread does when the broker fails.
    thread = threading.Thread(target=lambda: (release(claims), connections.close_all()))
    thread.start()
    thread.join(10)
    for alias, task in made.items():
        assert TimeoutTask.objects.using(alias).get(job_id=task.job_id).status == Status.PENDING


def test_the_scan_covers_every_shard(starts, eager_celery):
    due = [timeouts.schedule("test.record", key_on(alias), delay=0) for alias in ALIASES]
    assert scan() == 3
    assert sorted(job_id for job_id, *_ in starts.all()) == sorted(task.job_id for task in due)


def test_a_shard_that_is_down_holds_back_only_its_own_tasks(starts, eager_celery, caplog):
    due = {alias: timeouts.schedule("test.record", key_on(alias), delay=0) for alias in ALIASES}
    with unreachable("shard_b"), caplog.at_level(logging.ERROR, "timeouts"):
        assert scan() == 2
    assert "the scan of shard 'shard_b' failed" in caplog.text
    assert sorted(job_id for job_id, *_ in starts.all()) == sorted([due["default"].job_id, due["shard_c"].job_id])
    assert scan() == 1  # back: its task runs, late, not lost
    assert starts.count() == 3


def test_a_durable_call_lives_on_the_shard_of_its_task_id_and_is_cancelled_there(broker):
    from tests.testapp.tasks import record

    results = [record.apply_async((n,), countdown=600) for n in range(60)]  # every shard gets some
    for result in results:
        alias = shards.hashed(result.id).alias
        assert where_call(result.id) == [alias]
    assert {shards.hashed(result.id).alias for result in results} == set(ALIASES)
    cancelled = results[0]
    assert timeouts.celery.cancel(cancelled.id)
    alias = shards.hashed(cancelled.id).alias
    assert TimeoutTask.objects.using(alias).get(biz_id=cancelled.id).status == Status.CANCELLED
    assert not timeouts.celery.cancel(cancelled.id)


def test_a_django_task_is_found_and_cancelled_on_its_shard_by_its_result_id(django_task_tables):
    from tests.testapp import django_tasks

    results = [django_tasks.add.using(run_after=in_an_hour()).enqueue(n, 1) for n in range(60)]
    held = {shards.alias_of_job(int(result.id.split("-")[0])) for result in results}
    assert held == set(ALIASES)  # spread: no business key ties them to one shard
    for result in results:
        assert django_tasks.add.get_result(result.id).id == result.id
    assert backend_cancel(results[0].id)
    job_id = int(results[0].id.split("-")[0])
    assert TimeoutTask.objects.using(shards.alias_of_job(job_id)).get(job_id=job_id).status == Status.CANCELLED


def test_a_django_task_cancelled_in_a_transaction_on_its_shard_follows_a_row_moved_meanwhile(django_task_tables):
    """A move under the cancel (SQLSTATE 40001) is retried in a savepoint of the caller's transaction on
    the task's shard, not of one on default, so the transaction goes on and the cancel wins."""
    from tests.testapp import django_tasks

    with transaction.atomic(using="shard_b"):
        result = django_tasks.add.using(run_after=in_an_hour()).enqueue(1, 1)
    job_id = int(result.id.split("-")[0])
    outcome = while_a_reschedule_moves_it(job_id, lambda: backend_cancel(result.id))
    assert outcome.get("moved") is True
    assert outcome.get("error") is None and outcome.get("value") is True
    assert TimeoutTask.objects.using("shard_b").get(job_id=job_id).status == Status.CANCELLED


def test_a_message_run_in_a_transaction_on_its_shard_follows_a_row_moved_meanwhile(starts):
    """A move under the compare-and-set start (SQLSTATE 40001) of a message run in the caller's
    process is retried in a savepoint of the caller's transaction on the task's shard, not of one on
    default, so the transaction goes on and the stale message is dropped."""
    task = timeouts.schedule("test.record", key_on("shard_b", "moved-under-start"), delay=0)
    with worker_connection.shared("shard_b"):
        [claim] = claim_due(10)

    def run_then_read():
        ran = tasks.run(*claim.message_args(), **claim.message_kwargs())
        return ran, TimeoutTask.objects.using("shard_b").get(job_id=task.job_id).status

    outcome = while_a_reschedule_moves_it(task.job_id, run_then_read)
    assert outcome.get("moved") is True
    assert outcome.get("error") is None and outcome.get("value") == ("dropped", Status.PENDING)
    assert starts.count() == 0


def test_lease_recovery_in_a_transaction_on_its_shard_retries_a_conflict_there():
    """A conflict (SQLSTATE 40001) under lease recovery run in the caller's transaction on shard_b is
    retried in a savepoint of that transaction, not of one on default, so the transaction goes on and
    the claim whose lease ran out is taken back."""
    task = timeouts.schedule("test.record", key_on("shard_b", "lease-ran-out"), delay=0)
    with worker_connection.shared("shard_b"):
        claim_due(10)
    TimeoutTask.objects.using("shard_b").filter(job_id=task.job_id).update(
        lease_until=datetime.now(UTC) - timedelta(seconds=1))
    with conflict_once("shard_b"), transaction.atomic(using="shard_b"), worker_connection.shared("shard_b"):
        assert recover_expired() == 1
    assert TimeoutTask.objects.using("shard_b").get(job_id=task.job_id).status == Status.PENDING


def where_call(task_id) -> list[str]:
    return [alias for alias in ALIASES if TimeoutTask.objects.using(alias).filter(biz_id=task_id).exists()]


def test_maintenance_covers_every_shard():
    newest = max((p for p in list_partitions(connections["shard_c"]) if not p.is_default), key=lambda p: p.lower)
    with connections["shard_c"].cursor() as cursor:
        cursor.execute(f"DROP TABLE {newest.name}")
    summaries = tasks.maintain()
    assert set(summaries) == set(ALIASES)
    assert summaries["shard_c"]["created"] == [newest.name]
    assert summaries["default"]["created"] == summaries["shard_b"]["created"] == []


def test_the_partitions_command_maintains_every_shard_or_the_one_named():
    out = io.StringIO()
    call_command("timeouts_partitions", "--dry-run", stdout=out)
    assert [line for line in out.getvalue().splitlines() if line.startswith("== shard")] == [
        f"== shard {alias}" for alias in ALIASES]
    out = io.StringIO()
    call_command("timeouts_partitions", "--json", "--database", "shard_c", stdout=out)
    assert json.loads(out.getvalue())["busy"] is False


def test_a_new_shard_takes_over_its_slots_with_their_tasks_limits_and_ids(settings):
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": ["default", "shard_b"]}
    made = [timeouts.schedule("test.record", f"move-{n}", delay=3600) for n in range(120)]
    timeouts.pause("test.record")
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": ALIASES}
    out = io.StringIO()
    call_command("timeouts_reshard", "--from", "default,shard_b", "--dry-run", stdout=out)
    assert out.getvalue().splitlines() == ["would move 170 slot(s) 342-511 from default to shard_b",
                                           "would move 341 slot(s) 683-1023 from shard_b to shard_c"]
    assert TimeoutTask.objects.using("shard_c").count() == 0
    call_command("timeouts_reshard", "--from", "default,shard_b", stdout=io.StringIO())
    for task in made:
        assert where(task.job_id) == [shards.alias_of_job(task.job_id)] == [shards.place("test.record",
                                                                                         task.biz_id).alias]
    assert timeouts.limits("test.record").paused
    with connections["shard_c"].cursor() as cursor:
        cursor.execute("SELECT paused FROM timeouts_limits WHERE biz_type = 'test.record'")
        assert cursor.fetchone() == (True,)
    newest = {timeouts.schedule("test.record", key_on(alias, "after"), delay=60).job_id for alias in ALIASES}
    assert not newest & {task.job_id for task in made}
    assert min(newest) > max(task.job_id for task in made)


def test_resharding_refuses_to_move_a_task_in_flight(settings):
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": ["default", "shard_b"]}
    biz_id = next(f"busy-{n}" for n in itertools.count() if shards.slot_of(f"busy-{n}") >= 683)
    task = timeouts.schedule("test.record", biz_id, delay=0)
    with worker_connection.shared("shard_b"):
        assert [claim.job_id for claim in claim_due(10)] == [task.job_id]
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": ALIASES}
    with pytest.raises(CommandError, match="1 task.s. are DISPATCHED or RUNNING"):
        call_command("timeouts_reshard", "--from", "default,shard_b", stdout=io.StringIO())
    assert where(task.job_id) == ["shard_b"]


def test_resharding_refuses_while_a_router_places_the_tasks(settings):
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": ["default", "shard_b"],
                         "SHARD_ROUTER": f"{__name__}.route_to_default"}
    made = [timeouts.schedule("test.record", f"routed-{n}", delay=3600) for n in range(60)]
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": ALIASES}
    for dry_run in (["--dry-run"], []):
        with pytest.raises(CommandError, match=r"SHARD_ROUTER'] is set") as refused:
            call_command("timeouts_reshard", "--from", "default,shard_b", *dry_run, stdout=io.StringIO())
        assert "Nothing was moved" in str(refused.value)
    assert [TimeoutTask.objects.using(alias).count() for alias in ALIASES] == [60, 0, 0]
    # Where the router looks, the tasks still are: cancel by key finds each one.
    assert sum(timeouts.cancel("test.record", task.biz_id) for task in made) == 60


def test_the_check_names_a_shard_without_migrations():
    assert checks.check_shards(databases=ALIASES) == []
    empty = f"{connections['shard_c'].settings_dict['NAME']}_empty"
    with _database(empty), _named("shard_c", empty):
        [problem] = checks.check_shards(databases=ALIASES)
        assert problem.id == "timeouts.W006" and "'shard_c' lacks timeouts' migrations 0001_initial" in problem.msg
        assert "migrate --database shard_c" in problem.hint
    out = io.StringIO()
    call_command("check", databases=ALIASES, stdout=out)
    assert "no issues" in out.getvalue()


def test_the_check_says_which_shard_it_cannot_reach():
    with unreachable("shard_b"):
        [problem] = checks.check_shards(databases=ALIASES)
    assert problem.id == "timeouts.W006" and "cannot read the shard 'shard_b'" in problem.msg


# -- scheduling and the caller's transaction ---------------------------------------------------------

class RolledBack(Exception):
    """Raised to roll a test's transaction back."""


def stored_anywhere() -> int:
    return sum(TimeoutTask.objects.using(alias).count() for alias in ALIASES)


def call_id_on(alias, prefix="call"):
    """A task_id whose DurableTask call lives on `alias` (by the hash alone)."""
    return next(task_id for task_id in (f"{prefix}-{n}" for n in itertools.count())
                if shards.hashed(task_id).alias == alias)


def route_to_default(biz_type, biz_id):
    """A SHARD_ROUTER that keeps every task on the database of the host's transaction."""
    return "default"


# on_conflict=None where a key is stored again (the same key for each way, on each shard in turn).
def _schedule(alias):
    timeouts.schedule("test.record", key_on(alias), delay=60, on_conflict=None)


def _schedule_keyed(alias):
    timeouts.schedule("test.record", key_on(alias), delay=60, on_conflict="replace")


def _bulk_schedule(alias):
    timeouts.bulk_schedule([{"biz_type": "test.record", "biz_id": key_on("default", "bulk"), "delay": 60,
                             "on_conflict": None},
                            {"biz_type": "test.record", "biz_id": key_on(alias, "bulk"), "delay": 60,
                             "on_conflict": None}])


def _durable_call(alias):
    from tests.testapp.tasks import record

    record.apply_async((1,), countdown=600, task_id=call_id_on(alias))


# Each way of storing a task whose shard follows from its key, given the shard the key lives on.
KEYED = {"schedule": _schedule, "schedule(on_conflict)": _schedule_keyed, "bulk_schedule": _bulk_schedule,
         "DurableTask.apply_async": _durable_call}


@pytest.mark.parametrize("entry", KEYED)
def test_storing_on_a_shard_outside_the_callers_transaction_is_refused_and_stores_nothing(entry, broker):
    with pytest.raises(ShardOutsideTransaction) as refused, transaction.atomic():
        KEYED[entry]("shard_b")
    message = str(refused.value)
    assert "'shard_b', which is not in a transaction" in message
    assert "while 'default' is" in message
    assert "transaction.atomic(using='shard_b')" in message and "transaction.on_commit()" in message
    assert ("SHARD_ROUTER" in message) == (entry != "DurableTask.apply_async")
    assert stored_anywhere() == 0


@pytest.mark.parametrize("entry", KEYED)
def test_inside_a_transaction_on_the_shard_too_storing_is_part_of_it(entry, broker):
    with pytest.raises(RolledBack), transaction.atomic(), transaction.atomic(using="shard_b"):
        KEYED[entry]("shard_b")
        assert TimeoutTask.objects.using("shard_b").count() == 1
        raise RolledBack
    assert stored_anywhere() == 0
    with transaction.atomic(), transaction.atomic(using="shard_b"):
        KEYED[entry]("shard_b")
    assert TimeoutTask.objects.using("shard_b").count() == 1


def test_a_transaction_on_a_shard_alone_refuses_tasks_for_default():
    with pytest.raises(ShardOutsideTransaction, match="'default', which is not in a transaction"), \
            transaction.atomic(using="shard_c"):
        timeouts.schedule("test.record", key_on("default"), delay=60)
    assert stored_anywhere() == 0


def test_outside_any_transaction_each_task_goes_to_its_shard_as_before(broker):
    for alias in ALIASES:
        for store in KEYED.values():
            store(alias)
    assert TimeoutTask.objects.using("shard_c").count() >= 4


def test_a_transaction_on_a_database_that_is_no_shard_does_not_count(settings):
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": ["default", "shard_b"]}
    with transaction.atomic(using="shard_c"):  # a database of the host's own, to timeouts
        task = timeouts.schedule("test.record", key_on("shard_b"), delay=60)
        timeouts.bulk_schedule([{"biz_type": "test.record", "biz_id": key_on("default", "other"), "delay": 60}])
    assert task._state.db == "shard_b"
    assert [TimeoutTask.objects.using(alias).count() for alias in ("default", "shard_b")] == [1, 1]


def test_a_router_that_keeps_tasks_on_the_callers_database_makes_scheduling_transactional(settings):
    elsewhere = [key_on(alias, "routed") for alias in ("shard_b", "shard_c")]  # by the hash
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARD_ROUTER": f"{__name__}.route_to_default"}
    with pytest.raises(RolledBack), transaction.atomic():
        timeouts.schedule("test.record", elsewhere[0], delay=60)
        timeouts.schedule("test.record", elsewhere[1], delay=60, on_conflict="keep")
        assert timeouts.bulk_schedule([{"biz_type": "test.record", "biz_id": biz_id, "delay": 60}
                                       for biz_id in ("bulk-1", "bulk-2", "bulk-3")]) == 3
        assert TimeoutTask.objects.count() == 5
        raise RolledBack
    assert stored_anywhere() == 0
    with transaction.atomic():
        timeouts.schedule("test.record", elsewhere[0], delay=60)
    assert TimeoutTask.objects.using("default").count() == stored_anywhere() == 1


def test_a_durable_call_without_a_task_id_goes_to_a_shard_of_the_callers_transaction(broker):
    from tests.testapp.tasks import record

    with pytest.raises(RolledBack), transaction.atomic():
        results = [record.apply_async((n,), countdown=600) for n in range(30)]
        assert {shards.hashed(result.id).alias for result in results} == {"default"}
        assert TimeoutTask.objects.count() == 30
        raise RolledBack
    assert stored_anywhere() == 0
    with transaction.atomic(using="shard_c"):
        result = record.apply_async((1,), countdown=600)
    assert where_call(result.id) == ["shard_c"]
    assert timeouts.celery.cancel(result.id)


def test_a_django_task_enqueued_in_a_transaction_goes_to_a_shard_of_that_transaction(django_task_tables):
    from tests.testapp import django_tasks

    with pytest.raises(RolledBack), transaction.atomic():
        results = [django_tasks.add.using(run_after=in_an_hour()).enqueue(n, 1) for n in range(30)]
        assert {shards.alias_of_job(int(result.id.split("-")[0])) for result in results} == {"default"}
        raise RolledBack
    assert stored_anywhere() == 0
    with transaction.atomic(using="shard_b"):
        result = django_tasks.add.using(run_after=in_an_hour()).enqueue(1, 1)
    assert shards.alias_of_job(int(result.id.split("-")[0])) == "shard_b"
    assert django_tasks.add.get_result(result.id).id == result.id


def test_a_django_task_enqueued_in_a_transaction_that_holds_no_shard_is_refused(settings, django_task_tables):
    from tests.testapp import django_tasks

    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": ["shard_b", "shard_c"]}
    with pytest.raises(ShardOutsideTransaction) as refused, transaction.atomic():
        django_tasks.add.using(run_after=in_an_hour()).enqueue(1, 1)
    assert "one of the shards 'shard_b', 'shard_c'" in str(refused.value)
    assert "while 'default' is" in str(refused.value)
    assert stored_anywhere() == 0


@pytest.mark.django_db(databases=ALIASES)  # as Django's TestCase: every database inside atomic()
def test_inside_a_test_case_that_wraps_every_database_scheduling_works(broker):
    for alias in ALIASES:
        for store in KEYED.values():
            store(alias)
    assert TimeoutTask.objects.using("shard_b").count() >= 4


# -- helpers -----------------------------------------------------------------------------------------


@contextmanager
def conflict_once(alias):
    """The next UPDATE of a task on `alias` fails with a serialization failure (SQLSTATE 40001), as
    under a concurrent move to another partition, but on cue; the ones after it go through. A
    sequence counts the UPDATEs, because a rolled-back savepoint does not roll it back."""
    with connections[alias].cursor() as cursor:
        cursor.execute("CREATE SEQUENCE test_conflicts")
        cursor.execute("CREATE FUNCTION test_conflict_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                       "IF nextval('test_conflicts') = 1 THEN RAISE EXCEPTION 'test conflict' "
                       "USING ERRCODE = 'serialization_failure'; END IF; RETURN NEW; END $$")
        cursor.execute("CREATE TRIGGER test_conflict_once BEFORE UPDATE ON timeouts_task "
                       "FOR EACH ROW EXECUTE FUNCTION test_conflict_once()")
    try:
        yield
    finally:
        with connections[alias].cursor() as cursor:
            cursor.execute("DROP TRIGGER test_conflict_once ON timeouts_task")
            cursor.execute("DROP FUNCTION test_conflict_once()")
            cursor.execute("DROP SEQUENCE test_conflicts")


def while_a_reschedule_moves_it(job_id, call):
    """call() in a transaction on shard_b, in a thread, while another transaction there has moved the
    task `job_id` to another partition (a reschedule): that one commits once call() waits for the
    row's lock. Returns {"moved": the reschedule's result, "value": call()'s, or "error": what it raised}."""
    moved, release_move = threading.Event(), threading.Event()

    def reschedule_and_hold():
        with transaction.atomic(using="shard_b"):
            result = TimeoutTask.objects.using("shard_b").get(job_id=job_id).reschedule(delay=timedelta(days=5))
            moved.set()
            release_move.wait(10)
        return result

    def call_in_a_transaction():
        with transaction.atomic(using="shard_b"):
            return call()

    mover, move = in_thread(reschedule_and_hold)
    assert moved.wait(10)
    caller, outcome = in_thread(call_in_a_transaction)
    caller.join(0.3)
    assert caller.is_alive()  # waits for the mover's row lock
    release_move.set()
    mover.join(10), caller.join(10)
    return {"moved": move.get("value"), **outcome}


@pytest.fixture
def django_task_tables():
    """The tables the Django tasks of the tests record their runs and signals in."""
    from tests.testapp import django_tasks

    with connections["default"].cursor() as cursor:
        cursor.execute(django_tasks.RUNS_TABLE_SQL)
        cursor.execute(django_tasks.SIGNALS_TABLE_SQL)
    yield
    django_tasks.close()


@pytest.fixture
def eager_celery():
    from celery import current_app

    current_app.conf.task_always_eager = True
    yield
    current_app.conf.task_always_eager = False


class _named:
    def __init__(self, alias, name):
        self.alias, self.name = alias, name

    def __enter__(self):
        connections[self.alias].close()
        self.before = connections[self.alias].settings_dict["NAME"]
        connections[self.alias].settings_dict["NAME"] = self.name

    def __exit__(self, *exc):
        connections[self.alias].close()
        connections[self.alias].settings_dict["NAME"] = self.before


class _database:
    """An empty database on the test server, dropped afterwards."""

    def __init__(self, name):
        self.name = name

    def _admin(self):
        db = connections["default"].settings_dict
        return psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"],
                               dbname="postgres", autocommit=True)

    def __enter__(self):
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}"')
            conn.execute(f'CREATE DATABASE "{self.name}"')

    def __exit__(self, *exc):
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
