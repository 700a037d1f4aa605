"""Partition maintenance on a real PostgreSQL: buckets, moving rows out of DEFAULT, retention,
interval changes, dry runs, the command, claims running alongside, and pruning of the claim query.

Most tests inject a `now` years away from the real clock, so the partitions they make do not touch
the ones `migrate` created; the `restore_partitions` fixture puts the partition set back afterwards.
"""

import io
import json
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from tests.support.factories import move_to
from timeouts.dispatch.claiming import claim_due
from timeouts.durable import calls
from timeouts.models import TimeoutTask
from timeouts.storage import partition_ddl, partitions
from timeouts.store.queries import QUERIES, fetch_dicts

pytestmark = pytest.mark.timeout(60)
# DDL, locks and other connections: every database test commits for real.
database = pytest.mark.django_db(transaction=True)

Status = TimeoutTask.Status
PENDING, DISPATCHED, DONE, CANCELLED, RUNNING, DEAD = (
    Status.PENDING, Status.DISPATCHED, Status.DONE, Status.CANCELLED, Status.RUNNING, Status.DEAD)
# The claim's parameters, on the only shard.
CLAIM_PARAMS = {"limit": 500, "lead": 0, "max_dispatched": 10_000, "shard_index": 0, "shard_count": 1,
                "attribute_prefixes": [calls.PREFIX]}


def settings(**given):
    base = {"PARTITION_INTERVAL": "day", "PARTITIONS_AHEAD": 3, "RETENTION": timedelta(days=7)}
    return override_settings(TIMEOUTS={**base, **given})


def at(text):
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def current():
    """name -> (lower, upper) of the attached partitions, DEFAULT left out."""
    return {p.name: (p.lower, p.upper) for p in partitions.list_partitions(connection) if not p.is_default}


def schedule(when, biz_id="1"):
    return TimeoutTask.objects.schedule("test.record", biz_id, at=when)


def table_of(task):
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM timeouts_task WHERE job_id = %s", [task.job_id])
        return cursor.fetchone()[0]


def table_exists(name):
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        return cursor.fetchone()[0]


@contextmanager
def other_connection(autocommit=True):
    """A psycopg connection of its own to the test database."""
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "server_side_binding", "prepare_threshold"):
        params.pop(key, None)
    conn = psycopg.connect(**params, autocommit=autocommit)
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture(autouse=True)
def restore_partitions(request):
    if request.node.get_closest_marker("django_db") is None:
        yield  # a test without the database
        return
    request.getfixturevalue("transactional_db")
    before = {p.name: p for p in partitions.list_partitions(connection) if not p.is_default}
    yield
    with connection.cursor() as cursor:
        for row in fetch_dicts("detached_leftovers", {"marker": partition_ddl.DETACHED_MARKER}):
            cursor.execute(f'DROP TABLE "{row["name"]}"')
        for name in current().keys() - before.keys():
            cursor.execute(f'DROP TABLE "{name}"')
        cursor.execute("TRUNCATE timeouts_task")
    for name in before.keys() - current().keys():
        partition_ddl.create_partition(connection, name, before[name].lower, before[name].upper)
    assert current().keys() == before.keys()


@database
def test_migrate_created_the_current_partitions():
    now = datetime.now(UTC)
    interval = partitions.get_settings().PARTITION_INTERVAL
    assert partitions.partition_name(partitions.bucket_start(now, interval), interval) in current()


@database
@pytest.mark.parametrize("interval, names", [
    ("hour", ["timeouts_task_h2021111913", "timeouts_task_h2021111914", "timeouts_task_h2021111915"]),
    ("day", ["timeouts_task_d20211119", "timeouts_task_d20211120", "timeouts_task_d20211121"]),
    ("week", ["timeouts_task_w20211115", "timeouts_task_w20211122", "timeouts_task_w20211129"]),
    ("month", ["timeouts_task_m202111", "timeouts_task_m202112", "timeouts_task_m202201"]),
])
def test_creates_current_and_ahead_buckets(interval, names):
    with settings(PARTITION_INTERVAL=interval, PARTITIONS_AHEAD=2):
        report = partitions.maintain(now=at("2021-11-19T13:45:00"))
        assert report.created == names
        assert report.failed == {}
        made = current()
        for name in names:
            assert made[name] == partitions.bounds_from_name(name)
        # Idempotent: a second run has nothing to do.
        again = partitions.maintain(now=at("2021-11-19T13:59:00"))
        assert again.created == [] and again.failed == {} and again.skipped_overlaps == {}
    json.dumps(report.summary())


@database
def test_new_partition_indexes_are_attached_to_the_parent_indexes():
    with settings(PARTITIONS_AHEAD=1):
        partitions.maintain(now=at("2021-11-19T13:45:00"))
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT parent.relname FROM pg_inherits AS i
            JOIN pg_class AS child ON child.oid = i.inhrelid JOIN pg_class AS parent ON parent.oid = i.inhparent
            JOIN pg_index AS x ON x.indexrelid = child.oid
            WHERE x.indrelid = 'timeouts_task_d20211119'::regclass ORDER BY 1""")
        parents = [row[0] for row in cursor.fetchall()]
        cursor.execute("SELECT count(*) FROM pg_constraint WHERE conname = 'timeouts_task_d20211119_bounds'")
        helper_checks = cursor.fetchone()[0]
    assert parents == ["timeouts_task_action_time", "timeouts_task_biz", "timeouts_task_biz_type", "timeouts_task_due",
                       "timeouts_task_due_by_type", "timeouts_task_ended_late", "timeouts_task_lease",
                       "timeouts_task_pkey", "timeouts_task_status"]
    assert helper_checks == 0


# --- Moving rows out of DEFAULT --------------------------------------------------------------------

@database
def test_rows_parked_in_default_move_into_the_new_partition():
    # Three days back has no partition (migrate started at today): the tasks park in DEFAULT.
    when = datetime.now(UTC) - timedelta(days=3)
    to_claim, to_cancel = schedule(when, "claim"), schedule(when + timedelta(seconds=1), "cancel")
    assert table_of(to_claim) == "timeouts_task_default"

    report = partitions.maintain()

    name = partitions.partition_name(partitions.bucket_start(when, "day"), "day")
    assert name in report.created and report.moved_rows[name] == 2
    assert "past bucket holding 2 row(s)" in report.why[name]
    assert table_of(to_claim) == table_of(to_cancel) == name
    assert report.default_rows == 0
    assert to_cancel.cancel() is True  # the same job_id and action_time still address it
    claims = claim_due(limit=10)
    assert [c.job_id for c in claims] == [to_claim.job_id]
    assert TimeoutTask.objects.get(job_id=to_cancel.job_id).status == CANCELLED


@database
def test_past_bucket_gets_its_partition_far_future_stays_in_default():
    now = at("2021-03-10T12:00:00")
    old, far = schedule(now - timedelta(days=30), "old"), schedule(now + timedelta(days=400), "far")
    with settings(PARTITIONS_AHEAD=3, RETENTION=timedelta(days=7)):
        report = partitions.maintain(now=now)
    assert table_of(old) == "timeouts_task_d20210208"
    assert table_of(far) == "timeouts_task_default"
    assert report.default_rows == 1
    # Past retention, but its task is still pending: kept, and the report says why.
    assert report.kept["timeouts_task_d20210208"] == "1 unfinished task(s): pending=1"
    # Once the window reaches the far-future task, it moves into its partition.
    with settings(PARTITIONS_AHEAD=3, RETENTION=timedelta(days=7)):
        later = partitions.maintain(now=now + timedelta(days=398))
    assert later.moved_rows["timeouts_task_d20220414"] == 1 and later.default_rows == 0
    assert table_of(far) == "timeouts_task_d20220414"
    assert "timeouts_task_d20210208" in later.kept


# --- Retention -------------------------------------------------------------------------------------

@database
def test_retention_drops_only_partitions_whose_tasks_all_finished():
    now = at("2021-03-20T12:00:00")
    days = {status: at(f"2021-03-0{day}T10:00:00") for day, status in
            zip(range(1, 7), (PENDING, DISPATCHED, RUNNING, DEAD, DONE, CANCELLED), strict=True)}
    tasks = {status: schedule(when, str(status)) for status, when in days.items()}
    done_too = schedule(days[CANCELLED] + timedelta(hours=1), "done-too")
    with settings(RETENTION=timedelta(days=2)):
        first = partitions.maintain(now=now)  # makes their partitions; all pending: all kept
        assert first.dropped == [] and len(first.kept) == 6
        for status in (DISPATCHED, RUNNING, DEAD, DONE, CANCELLED):
            move_to(tasks[status], status)
        move_to(done_too, DONE)

        report = partitions.maintain(now=now)

    assert sorted(report.dropped) == ["timeouts_task_d20210305", "timeouts_task_d20210306"]
    assert report.kept == {
        "timeouts_task_d20210301": "1 unfinished task(s): pending=1",
        "timeouts_task_d20210302": "1 unfinished task(s): dispatched=1",
        "timeouts_task_d20210303": "1 unfinished task(s): running=1",
        "timeouts_task_d20210304": "1 unfinished task(s): dead=1",
    }
    assert not table_exists("timeouts_task_d20210305") and not table_exists("timeouts_task_d20210306")
    for status in (PENDING, DISPATCHED, RUNNING, DEAD):
        assert TimeoutTask.objects.filter(job_id=tasks[status].job_id).exists()
    assert not TimeoutTask.objects.filter(job_id__in=[tasks[DONE].job_id, done_too.job_id]).exists()
    # The partitions created ahead are well within retention.
    assert "timeouts_task_d20210320" in current()


@database
def test_an_interrupted_drop_is_finished_by_the_next_run():
    now = at("2021-03-20T12:00:00")
    finished, waiting = schedule(at("2021-03-01T10:00:00"), "finished"), schedule(at("2021-03-02T10:00:00"), "waiting")
    with settings(RETENTION=timedelta(days=2)):
        partitions.maintain(now=now)
        move_to(finished, DONE)
        # A run detached both (the pending one by a race) and died before checking them.
        partition_ddl.detach(connection, "timeouts_task_d20210301")
        partition_ddl.detach(connection, "timeouts_task_d20210302")
        assert "timeouts_task_d20210302" not in current()
        assert partitions.maintain(now=now, dry_run=True).kept["timeouts_task_d20210302"].startswith("detached")

        report = partitions.maintain(now=now)

    assert "timeouts_task_d20210301" in report.dropped and not table_exists("timeouts_task_d20210301")
    assert "attached again" in report.kept["timeouts_task_d20210302"]
    assert table_of(waiting) == "timeouts_task_d20210302"
    assert waiting.cancel() is True


@database
def test_partitions_not_named_by_maintenance_are_left_alone():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE archive_2020 (LIKE timeouts_task INCLUDING ALL)")
        cursor.execute("ALTER TABLE timeouts_task ATTACH PARTITION archive_2020 "
                       "FOR VALUES FROM ('2020-01-01 00:00+00') TO ('2020-01-02 00:00+00')")
    try:
        report = partitions.maintain(now=at("2021-03-20T12:00:00"))
        assert "left alone" in report.kept["archive_2020"]
        assert "archive_2020" in current()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE archive_2020")


# --- Interval changes, dry runs, the command, the lock --------------------------------------------

@database
def test_interval_change_creates_no_overlapping_partition():
    now = at("2021-05-12T12:00:00")  # a Wednesday
    with settings(PARTITION_INTERVAL="day", PARTITIONS_AHEAD=3):
        partitions.maintain(now=now)  # days 12..15
    in_gap = schedule(at("2021-05-16T09:00:00"), "gap")  # no day partition, and its week overlaps
    with settings(PARTITION_INTERVAL="week", PARTITIONS_AHEAD=2):
        weekly = partitions.maintain(now=now)
    with settings(PARTITION_INTERVAL="month", PARTITIONS_AHEAD=1):
        monthly = partitions.maintain(now=now)

    assert weekly.skipped_overlaps == {
        "timeouts_task_w20210510": "overlaps timeouts_task_d20210512; its rows stay in DEFAULT"}
    assert weekly.created == ["timeouts_task_w20210517", "timeouts_task_w20210524"]
    assert list(monthly.skipped_overlaps) == ["timeouts_task_m202105"] and monthly.created == ["timeouts_task_m202106"]
    assert weekly.failed == monthly.failed == {}
    assert table_of(in_gap) == "timeouts_task_default"
    ranges = sorted(current().values())
    for (_, upper), (lower, _) in zip(ranges, ranges[1:], strict=False):
        assert upper <= lower, "partitions overlap"


@database
def test_dry_run_changes_nothing():
    now = at("2021-03-20T12:00:00")
    with settings(RETENTION=timedelta(days=2)):
        partitions.maintain(now=now)
        old = schedule(at("2021-03-01T10:00:00"), "old")
        partitions.maintain(now=now)
        move_to(old, DONE)
        parked = schedule(at("2021-02-01T10:00:00"), "parked")
        before = current()

        report = partitions.maintain(now=now + timedelta(days=1), dry_run=True)

        assert report.dry_run
        assert report.created == ["timeouts_task_d20210201", "timeouts_task_d20210324"]
        assert report.moved_rows == {"timeouts_task_d20210201": 1, "timeouts_task_d20210324": 0}
        assert report.dropped == ["timeouts_task_d20210301"]
        assert current() == before
        assert table_of(parked) == "timeouts_task_default" and table_of(old) == "timeouts_task_d20210301"
        json.dumps(report.summary())


@database
def test_command_prints_the_partitions_and_what_it_did():
    schedule(datetime.now(UTC) - timedelta(days=3), "parked")
    out = io.StringIO()
    call_command("timeouts_partitions", "--dry-run", stdout=out)
    assert "DRY RUN" in out.getvalue() and "would be created" in out.getvalue()
    assert "1 row(s) would be moved from DEFAULT" in out.getvalue()

    out = io.StringIO()
    call_command("timeouts_partitions", stdout=out)
    text = out.getvalue()
    assert "timeouts_task_default" in text and "created (past bucket holding 1 row(s)" in text

    out = io.StringIO()
    call_command("timeouts_partitions", "--json", stdout=out)
    summary = json.loads(out.getvalue())
    assert summary["created"] == [] and summary["default_rows"] == 0 and summary["partitions"]


@database
def test_a_second_maintenance_at_the_same_time_does_nothing():
    with other_connection() as holder:
        holder.execute("SELECT pg_advisory_lock(%s, %s)", (partitions.LOCK_NAMESPACE, partitions.LOCK_KEY))
        report = partitions.maintain(now=at("2021-03-20T12:00:00"))
    assert report.busy and report.created == []
    assert report.summary()["busy"] is True


# --- Claims running alongside ----------------------------------------------------------------------

class Claimer(threading.Thread):
    """Runs the claim query in a loop on its own connection and records how long each took."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.durations = []
        self.error = None

    def run(self):
        try:
            with other_connection() as conn:
                conn.execute("SET statement_timeout = '10s'")
                while not self.stop.is_set():
                    started = time.monotonic()
                    conn.execute(QUERIES["claim_due"], CLAIM_PARAMS).fetchall()
                    self.durations.append(time.monotonic() - started)
                    time.sleep(0.02)
        except Exception as exc:  # reported by the test
            self.error = exc


@database
@pytest.mark.timeout(90)
@pytest.mark.parametrize("default_row_locked", [True, False], ids=["default-row-claimed", "default-row-free"])
def test_maintenance_gives_way_to_an_open_claim(default_row_locked):
    now = datetime.now(UTC)
    today_task = schedule(now - timedelta(minutes=1), "today")
    parked = schedule(now - timedelta(days=3), "parked")  # in DEFAULT: its partition is to be made
    if not default_row_locked:
        move_to(parked, CANCELLED)  # the open claim will not lock it
    claimer = Claimer()
    with other_connection(autocommit=False) as holder, settings(PARTITIONS_AHEAD=16):
        claimed = holder.execute(QUERIES["claim_due"], CLAIM_PARAMS).fetchall()
        assert {row[0] for row in claimed} == {today_task.job_id} | ({parked.job_id} if default_row_locked else set())
        claimer.start()
        try:
            started = time.monotonic()
            report = partitions.maintain()
            took = time.monotonic() - started
        finally:
            claimer.stop.set()
            claimer.join(15)
        holder.commit()  # the claim transaction ends: now maintenance can do its work

        assert claimer.error is None
        # Gave up within a bounded time, and said so: nothing half done.
        assert took < 10, took
        assert report.created == [] and report.failed
        assert "lock timeout" in next(iter(report.failed.values()))
        assert table_of(parked) == "timeouts_task_default"
        # No claim waited much longer than the lock_timeout (0.5 s).
        assert claimer.durations and max(claimer.durations) < 0.5 + 0.5, max(claimer.durations)
        if not default_row_locked:
            # The rows moved, then ATTACH queued for DEFAULT's ACCESS EXCLUSIVE lock behind the open
            # claim, and claims queued behind it, each time until its lock_timeout expired.
            assert max(claimer.durations) > 0.2, max(claimer.durations)

        again = partitions.maintain()
    assert again.failed == {} and len(again.created) == 3
    assert table_of(parked) != "timeouts_task_default"


# --- The claim query prunes future partitions -------------------------------------------------------

@database
def test_claim_query_prunes_future_partitions_and_uses_the_due_index():
    now = datetime.now(UTC)
    with settings(PARTITIONS_AHEAD=6):
        partitions.maintain()
    items = [{"biz_type": "test.record", "biz_id": str(i), "at": now + timedelta(hours=i), "on_conflict": None}
             for i in range(-12, 24 * 6)]
    TimeoutTask.objects.bulk_schedule(items * 20)  # twenty tasks of each key
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE timeouts_task")
        cursor.execute("BEGIN")
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + QUERIES["claim_due"],
                       CLAIM_PARAMS)
        [plan] = cursor.fetchone()[0]
        cursor.execute("ROLLBACK")
        cursor.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                       "WHERE i.inhparent = 'timeouts_task_due_by_type'::regclass")
        due_indexes = {row[0] for row in cursor.fetchall()}

    def scans(node, cte=None):
        cte = node.get("Subplan Name", cte) if node.get("Subplan Name", "").startswith("CTE ") else cte
        if "Relation Name" in node:
            yield cte, node
        for child in node.get("Plans", []):
            yield from scans(child, cte)

    future = [name for name, (lower, _) in current().items() if lower > now + timedelta(hours=1)]
    assert len(future) >= 5
    read = [(cte, node) for cte, node in scans(plan["Plan"]) if node["Actual Loops"]]
    # The scans that find and take due tasks never run on a future partition (pruned while the
    # claim runs: the claim compares times with an InitPlan's value, see claim_due). Only the step
    # from one biz_type to the next probes every partition (pending_types), one index entry each.
    assert not [(cte, node["Relation Name"]) for cte, node in read
                if node["Relation Name"] in future and cte != "CTE pending_types"], read
    taken = [node for cte, node in read if cte == "CTE first_round"]
    assert taken and all(node.get("Index Name") in due_indexes for node in taken), taken
