"""The hot-path queries run as prepared statements when the host lets psycopg prepare (the demo and
test settings set DATABASES OPTIONS prepare_threshold = 5), and nothing else of the host changes."""

import datetime
import gc
import weakref

import psycopg
import pytest
from django.db import connection, connections, transaction
from psycopg.pq import Format

from timeouts.dispatch.claiming import claim_due
from timeouts.errors import TaskConflict
from timeouts.models import TimeoutTask
from timeouts.store.queries import QUERIES, on_partition
from timeouts.worker import running

TIMESTAMPTZ = psycopg.postgres.types["timestamptz"].oid

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def is_prepared(name, partition=None) -> bool:
    # PostgreSQL shows the statement with $n placeholders: compare the text before the first one.
    text = QUERIES[name] if partition is None else on_partition(name, partition)
    head = text.split("%(")[0]
    return any(statement.startswith(head) for statement in prepared_statements())


def schedule_plain(biz_id, **when):
    """schedule() by its INSERT alone (on_conflict=None), outside a transaction: insert_task_autocommit."""
    return TimeoutTask.objects.schedule("test.record", biz_id, on_conflict=None, **when)


def run_due_tasks(n) -> str:
    """Runs n due tasks; returns the partition they are in, where their starts and DONEs ran."""
    for key in range(n):
        schedule_plain(key, delay=-0.001)
    claims = claim_due(n)  # one claim; each start and DONE runs n times
    for claim in claims:
        assert running.run(claim.fence) == "done"
    [partition] = {claim.partition for claim in claims}
    return partition


def test_the_hot_path_is_prepared_and_the_hosts_queries_are_not(starts):
    assert connection.settings_dict["OPTIONS"].get("prepare_threshold") == 5
    partition = run_due_tasks(7)
    for _ in range(7):
        claim_due(10)
        list(TimeoutTask.objects.filter(biz_id="0"))  # a host's ORM query, 7 times
    for name in ("insert_task_autocommit", "claim_due"):  # schedule() outside a transaction
        assert is_prepared(name), name
    for name in ("start_task", "finish_task"):  # on the task's partition (test_on_partition.py)
        assert is_prepared(name, partition), name
    assert len(prepared_statements()) == 4, "only those four ran more than prepare_threshold times"


def test_the_key_s_lock_and_read_with_the_insert_are_prepared_too():
    """schedule() with on_conflict (by default): the key's advisory lock, the read of its waiting
    task and the INSERT, in one statement outside a transaction, in three inside one."""
    for key in range(7):
        TimeoutTask.objects.schedule("test.record", key, delay=60)
    assert is_prepared("schedule_keyed")
    for key in range(7, 14):
        with transaction.atomic():
            TimeoutTask.objects.schedule("test.record", key, delay=60)
    for name in ("lock_biz_key", "waiting_tasks_for_key", "insert_task"):
        assert is_prepared(name), name
    with pytest.raises(TaskConflict):  # the prepared read sees the waiting task
        TimeoutTask.objects.schedule("test.record", 3, delay=60)
    kept = TimeoutTask.objects.schedule("test.record", 3, delay=5, on_conflict="keep")
    fetched = TimeoutTask.objects.get(job_id=kept.job_id)  # the prepared read gives the row as the ORM does
    for field in TimeoutTask._meta.concrete_fields:
        assert getattr(kept, field.attname) == getattr(fetched, field.attname), field.name
    assert TimeoutTask.objects.count() == 14


def test_a_prepared_start_survives_a_new_column(starts):
    # Its RETURNING * changes shape: psycopg prepares it again rather than failing.
    partition = run_due_tasks(7)  # start_task and finish_task are prepared now
    assert is_prepared("start_task", partition)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE timeouts_task ADD COLUMN added_by_a_migration integer")
    try:
        run_due_tasks(2)
        assert TimeoutTask.objects.filter(status=TimeoutTask.Status.DONE).count() == starts.count() == 9
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE timeouts_task DROP COLUMN added_by_a_migration")


def test_a_debounce_of_a_pending_task_is_one_prepared_statement_that_survives_a_new_column():
    """Outside a transaction: no BEGIN, no COMMIT, no lock of its own, one statement. A migration
    that adds a column changes the row the function returns: psycopg prepares it again."""

    def debounce(**options):
        return TimeoutTask.objects.schedule("test.record", "k", delay=60, on_conflict="debounce", **options)

    first = debounce()
    seen = []
    with connection.execute_wrapper(
            lambda execute, sql, params, many, context: seen.append(sql) or execute(sql, params, many, context)):
        for _ in range(6):
            assert debounce().job_id == first.job_id
    assert seen == [QUERIES["debounce_task"]] * 6
    assert is_prepared("debounce_task")
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE timeouts_task ADD COLUMN added_by_a_migration integer")
    try:
        moved = debounce(attribute={"after": "the migration"})
        fetched = TimeoutTask.objects.get(job_id=first.job_id)
        for field in TimeoutTask._meta.concrete_fields:
            assert getattr(moved, field.attname) == getattr(fetched, field.attname), field.name
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE timeouts_task DROP COLUMN added_by_a_migration")


def test_a_bare_psycopg_connection_runs_the_hot_path_queries_too():
    # The reliability scenarios' oracle schedules through one (its own transactions, its own server).
    import psycopg

    from timeouts.store.queries import fetch_one
    from timeouts.store.scheduling import prepare

    params = {key: value for key, value in connection.get_connection_params().items()
              if key not in ("cursor_factory", "context")}
    with psycopg.connect(**params) as conn:
        row = fetch_one("insert_task", prepare("test.record", 1, delay=60).params(), using=conn)
    assert TimeoutTask.objects.filter(job_id=row["job_id"]).exists()


def kept_cursor(name):
    from timeouts.store.queries import _KEPT

    owner, cursors = _KEPT[connections["default"]]
    assert owner is connection.connection
    return cursors[name]


def test_each_hot_query_keeps_one_cursor_per_connection_and_a_new_connection_gets_new_ones():
    # psycopg caches the dumpers and loaders per cursor: a kept cursor skips looking them up again.
    schedule_plain(1, delay=60)
    kept = kept_cursor("insert_task_autocommit")
    schedule_plain(2, delay=60)
    assert kept_cursor("insert_task_autocommit") is kept and not kept.closed
    connection.close()
    schedule_plain(3, delay=60)
    assert kept_cursor("insert_task_autocommit") is not kept
    assert TimeoutTask.objects.count() == 3


def test_a_closed_connection_is_not_kept_alive_by_its_cursors():
    # A web process with CONN_MAX_AGE = 0 opens a connection per request.
    TimeoutTask.objects.schedule("test.record", 1, delay=60)
    closed = weakref.ref(connection.connection)
    connection.close()
    TimeoutTask.objects.schedule("test.record", 2, delay=60)
    gc.collect()
    assert closed() is None


def test_the_hot_path_keeps_djangos_query_log_hooks_and_errors():
    from django.db import DataError
    from django.test.utils import CaptureQueriesContext

    from timeouts.store.queries import execute
    from timeouts.store.scheduling import prepare

    seen = []
    with CaptureQueriesContext(connection) as logged, connection.execute_wrapper(
            lambda execute, sql, params, many, context: seen.append(sql) or execute(sql, params, many, context)):
        schedule_plain(1, delay=60)
    head = QUERIES["insert_task_autocommit"].split("%(")[0]
    assert len(seen) == 1 and seen[0].startswith(head)  # one INSERT, hooked
    assert [q["sql"][:len(head)] for q in logged.captured_queries] == [head]  # and logged

    broken = {**prepare("test.record", 2, delay=60).params(), "attribute": "{not json"}
    with pytest.raises(DataError):  # Django's error class, as from any Django cursor
        execute("insert_task", broken, using=connection)
    schedule_plain(3, delay=60)  # the kept cursor goes on after an error
    assert sorted(TimeoutTask.objects.values_list("biz_id", flat=True)) == ["1", "3"]


def test_the_hot_queries_read_timestamps_as_the_orm_does_and_keep_djangos_loader_in_another_zone():
    # psycopg's compiled loader stands in for Django's Python one only where the two agree: when the
    # session's time zone is Django's, which Django sets when it connects.
    def loader(name):
        return kept_cursor(name).adapters.get_loader(TIMESTAMPTZ, Format.TEXT)

    task = schedule_plain(1, delay=60)
    fetched = TimeoutTask.objects.get(job_id=task.job_id)
    for name in ("action_time", "created_at"):
        assert getattr(task, name) == getattr(fetched, name)
        assert getattr(task, name).tzinfo is getattr(fetched, name).tzinfo is datetime.UTC
    assert loader("insert_task_autocommit") is psycopg.adapters.get_loader(TIMESTAMPTZ, Format.TEXT)

    connection.close()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'Asia/Tokyo'")  # a host's own setting, on this connection
        task = schedule_plain(2, delay=60)
        assert loader("insert_task_autocommit") is connection.connection.adapters.get_loader(TIMESTAMPTZ, Format.TEXT)
        assert task.action_time == TimeoutTask.objects.get(job_id=task.job_id).action_time
    finally:
        connection.close()
