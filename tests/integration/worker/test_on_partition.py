"""The worker's start and DONE (a stored Celery call's outcome too) go straight to the partition the
claim found the row in (the message carries it), and through the partitioned parent whenever that
is not where the row is."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from tests.integration import waits
from tests.testapp import tasks
from timeouts.dispatch.claiming import claim_due
from timeouts.models import TimeoutTask
from timeouts.protocol import from_batch_item, from_run
from timeouts.storage import partition_ddl
from timeouts.store import attempts, queries, worker_connection
from timeouts.worker import attempt, running

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def claim_one(biz_id=1, **when):
    task = TimeoutTask.objects.schedule("test.record", biz_id, **(when or {"delay": -0.001}))
    [claim] = claim_due(10)
    assert claim.job_id == task.job_id
    return claim


def updates_of(captured) -> list[str]:
    """The table each UPDATE of the captured queries went to."""
    return [q["sql"].split("UPDATE ", 1)[1].split()[0] for q in captured if "\nUPDATE " in q["sql"]]


def partition_of(job_id) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM timeouts_task WHERE job_id = %s", [job_id])
        return cursor.fetchone()[0]


def status_of(claim):
    return TimeoutTask.objects.get(job_id=claim.job_id).status


def test_the_claim_names_the_partition_and_the_worker_updates_it_directly(starts):
    claim = claim_one()
    assert claim.partition == partition_of(claim.job_id) != "timeouts_task"
    assert from_run(*claim.message_args()).partition == from_batch_item(claim.batch_item()).partition == claim.partition
    with CaptureQueriesContext(connection) as captured:
        assert running.run(claim.fence) == "done"
    assert updates_of(captured) == [claim.partition, claim.partition]  # the start, the DONE
    assert starts.count() == 1


def test_a_stored_celery_calls_outcome_goes_straight_to_its_partition():
    tasks.record.apply_async((1,), countdown=0.05)  # a DurableTask call: a row
    waits.until_all_due()
    [claim] = claim_due(10)
    assert claim.partition == partition_of(claim.job_id) != "timeouts_task"
    key = {"job_id": claim.job_id, "action_time": claim.action_time}
    with worker_connection.shared(claim.shard), CaptureQueriesContext(connection) as captured:
        row = attempt.start(key, claim.attempt, partition=claim.partition)
        assert attempts.end_call(key, claim.attempt, Status.DONE, "", row.started_at, claim.partition) is not None
    assert updates_of(captured) == [claim.partition, claim.partition]  # the start, the outcome
    assert status_of(claim) == Status.DONE


@pytest.mark.parametrize("partition", [
    "timeouts_task_d19990101",  # no such table
    "timeouts_task; DROP TABLE timeouts_task",  # never spliced into SQL
    "public.timeouts_task_d20261121",  # only bare names of timeouts' own partitions
    "pg_class",
    None,
    17,
])
def test_a_message_naming_no_usable_partition_runs_through_the_parent(starts, partition):
    claim = claim_one()
    with CaptureQueriesContext(connection) as captured:
        assert running.run(from_run(claim.job_id, claim.action_time.isoformat(), claim.attempt, partition)) == "done"
    # A name that could be a partition is tried first (and fails: there is no such table).
    tried = [partition] if partition == "timeouts_task_d19990101" else []
    assert updates_of(captured) == [*tried, "timeouts_task"] * 2
    assert status_of(claim) == Status.DONE and starts.count() == 1


def test_a_row_moved_out_of_default_after_its_claim_is_found_through_the_parent(starts):
    # Due long ago, before any partition: the row is in DEFAULT when claimed, then maintenance
    # creates the partition for its range and moves it there before the worker starts it.
    action_time = datetime(2001, 2, 3, 4, 5, tzinfo=UTC)
    claim = claim_one(at=action_time)
    assert claim.partition == "timeouts_task_default"
    name = "timeouts_task_d20010203"
    partition_ddl.create_partition(connection, name, action_time.replace(hour=0, minute=0),
                                   action_time.replace(hour=0, minute=0) + timedelta(days=1))
    try:
        assert partition_of(claim.job_id) == name
        with CaptureQueriesContext(connection) as captured:
            assert running.run(claim.fence) == "done"
        # Each statement missed DEFAULT, then found the row through the parent.
        assert updates_of(captured) == ["timeouts_task_default", "timeouts_task"] * 2
        assert status_of(claim) == Status.DONE and starts.count() == 1
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE {name}")


def test_a_stale_message_naming_its_partition_is_still_dropped(starts):
    claim = claim_one()
    assert running.run(claim.fence) == "done"
    assert running.run(claim.fence) == "dropped"
    assert starts.count() == 1


def test_inside_a_hosts_transaction_the_parent_is_used(starts):
    # A missing partition would abort the host's transaction: eager tasks take no shortcut.
    claim = claim_one()
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        assert running.run(from_run(claim.job_id, claim.action_time.isoformat(), claim.attempt,
                                    "timeouts_task_d19990101")) == "done"
    assert updates_of(captured) == ["timeouts_task", "timeouts_task"]
    assert status_of(claim) == Status.DONE


def test_only_the_start_and_the_done_run_on_a_partition():
    assert queries.on_partition("finish_task", "timeouts_task_default").startswith(
        queries.QUERIES["finish_task"].split(queries.PARENT_UPDATE)[0])
    for name, partition in (("fail_task", "timeouts_task_default"), ("start_task", "timeouts_task x")):
        with pytest.raises(ValueError):
            queries.on_partition(name, partition)
