"""schedule()'s keyed paths (every on_conflict, debounce included) read a key's waiting task by the
key's own index, whatever the planner would otherwise prefer: the plan PL/pgSQL keeps for a
connection may have been made before the table had statistics, and is kept whatever the table
grows to."""

from datetime import timedelta

import pytest
from django.db import connection

from timeouts.models import TimeoutTask

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

# idx_scan of every partition's index of one index of the partitioned table.
SCANS = """
SELECT coalesce(sum(s.idx_scan), 0)
FROM pg_partition_tree(%s::regclass) AS p JOIN pg_stat_user_indexes AS s ON s.indexrelid = p.relid
"""


def index_scans(index) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # this session's counts, once it is idle
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(SCANS, [index])
        return cursor.fetchone()[0]


# The indexes through which a plan could find a key's rows only by reading many others on every
# call: those that lead with biz_type, and those of the PENDING tasks, which a plan may walk whole
# because their condition is implied by a read of the key's PENDING task.
NOT_THE_KEY_S = ("timeouts_task_biz_type", "timeouts_task_due_by_type", "timeouts_task_due")


def scans_not_by_key() -> int:
    return sum(index_scans(index) for index in NOT_THE_KEY_S)


def test_the_keyed_reads_take_the_key_s_index_even_when_another_index_could_serve_them():
    """With sorting made as costly as the planner allows (enable_sort off), and the partitions too
    small for their statistics to tell two indexes apart, a plan that found the key's rows through
    an index that leads with biz_type, or through an index of the PENDING tasks walked whole, would
    read every waiting task of the biz_type (or every PENDING task), by biz_type, for its order or
    for the index's condition; the keyed statements can use no index but the (biz_id, biz_type) one."""
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": f"many-{i}", "delay": timedelta(hours=1)}
                                       for i in range(2000)])
    connection.close()  # a new session: no plan kept from before
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET enable_sort = off")
        by_others, by_key = scans_not_by_key(), index_scans("timeouts_task_biz")
        for i in range(12):  # past the five custom plans, to the generic one PL/pgSQL then keeps
            TimeoutTask.objects.schedule("test.record", f"key-{i}", delay=timedelta(hours=1))
            TimeoutTask.objects.schedule("test.record", f"key-{i}", delay=timedelta(hours=2), on_conflict="replace")
            TimeoutTask.objects.schedule("test.record", f"key-{i}", delay=timedelta(hours=3), on_conflict="debounce")
        assert scans_not_by_key() == by_others
        assert index_scans("timeouts_task_biz") > by_key
    finally:
        connection.close()
