"""Races under load: claimers racing on one instant's tasks, a cancel storm while tasks come
due and move across partitions, and on_conflict scheduling of one key from two threads. Sizes scale
with TIMEOUTS_RELIABILITY_SCALE (race_tools.py); run with -s
to see what each scenario measured."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections

import timeouts
from timeouts.models import TimeoutTask

from .oracle import check
from .race_tools import (
    MAX_DISPATCHED,
    WORKER,
    Stopwatch,
    database_now,
    finish_actor,
    insert_tasks,
    scaled,
    spawn_actor,
    timeout_for,
)

Status = TimeoutTask.Status
# Backpressure (MAX_DISPATCHED) holds the claimers to a hundred claims in flight: they race for the
# next ones all through the backlog, hundreds of rounds at this size. More tasks repeat those rounds.
CLAIM_RACE_TASKS = scaled(15_000, minimum=200)
KEYS = scaled(1_000, minimum=50)


@pytest.mark.reliability
@pytest.mark.timeout(timeout_for(900))
def test_two_scanners_and_two_dispatchers_start_each_of_one_instants_tasks_once(system, oracle):
    system.extra_env["TIMEOUTS_MAX_DISPATCHED"] = MAX_DISPATCHED
    worker = system.worker(**WORKER)
    for n in (1, 2):
        system.dispatcher(f"dispatcher-{n}")
        system.scanner(f"scanner-{n}", interval=1)
    system.wait_worker_ready(worker)
    clock = Stopwatch()
    due = database_now(system.database_url) + timedelta(seconds=5)
    jobs = insert_tasks(system.database_url, oracle, "oracle.ok", range(CLAIM_RACE_TASKS), [due] * CLAIM_RACE_TASKS)
    clock.lap("scheduled")
    system.wait_until_final(timeout=60 + CLAIM_RACE_TASKS / 60)
    clock.lap("all final")
    system.wait_broker_drained(timeout=60)
    report = check(system.database_url, oracle.dsn, recovery_window=30)
    seconds = clock.laps["all final"] - clock.laps["scheduled"] - 5
    print(f"\nclaim race: {len(jobs)} tasks due at one instant, 2 dispatchers + 2 scanners, worker {WORKER}: "
          f"{clock}; all ran {seconds:.1f} s after their due time ({len(jobs) / max(seconds, 0.1):.0f} runs/s); "
          f"dropped stale messages: {system.log_count('dropped stale message')}\n{report}")
    report.assert_clean()
    assert report.counts["runs"] == len(jobs) and report.counts["done"] == len(jobs)


# The storm's rate (500 tasks due and 250 cancels a second, a tenth of them moved across partitions
# first) is what makes the races; its size makes it last (30 s here), not hit other races.
STORM_TASKS = scaled(15_000, minimum=400)
STORM_SPAN = max(20.0, STORM_TASKS / 500)  # seconds over which the storm's tasks come due
PROVOKED_MOVES = 10


@pytest.mark.reliability
@pytest.mark.timeout(timeout_for(900))
def test_a_cancel_storm_while_tasks_come_due_never_lets_a_cancelled_task_run(system, oracle):
    """Half the tasks are cancelled around the moment they come due (before, while being claimed,
    while their message travels, after they ran), a tenth were scheduled two days out (another
    partition) and are rescheduled into the storm shortly before, so cancels with the caller's stale
    instance must follow the row. A few moves are held open while a cancel waits for the row: the
    cancel then fails with 40001 and must retry."""
    system.extra_env["TIMEOUTS_MAX_DISPATCHED"] = MAX_DISPATCHED
    worker = system.worker(**WORKER)
    system.dispatcher()
    system.scanner(interval=1)
    system.wait_worker_ready(worker)
    clock = Stopwatch()
    start = database_now(system.database_url) + timedelta(seconds=20)  # after the provoked moves
    due = [start + timedelta(seconds=STORM_SPAN * i / STORM_TASKS) for i in range(STORM_TASKS)]
    moved = {i for i in range(STORM_TASKS) if i % 10 == 5}
    initial = [due[i] + timedelta(days=2) if i in moved else due[i] for i in range(STORM_TASKS)]
    jobs = insert_tasks(system.database_url, oracle, "oracle.ok", [f"s{i}" for i in range(STORM_TASKS)], initial)
    clock.lap("scheduled")

    def job(i):
        job_id, biz_id, action_time = jobs[i]
        return {"job_id": job_id, "biz_id": biz_id, "action_time": action_time.isoformat(),
                "due": due[i].timestamp(), "by_key": i % 10 == 4}

    middle = sorted(moved)[len(moved) // 2:]
    provoked = middle[:PROVOKED_MOVES]
    spec = {"oracle_dsn": oracle.dsn, "threads": 4, "provoke": [job(i) for i in provoked],
            "reschedule": [job(i) for i in sorted(moved - set(provoked))],
            "cancel": [job(i) for i in range(STORM_TASKS) if i % 2 == 1 or i in provoked]}
    storm = finish_actor(system, spawn_actor(system, "storm", "storm", spec), timeout=STORM_SPAN + 180)
    clock.lap("storm over")
    system.wait_until_final(timeout=60 + STORM_TASKS / 80)
    system.wait_broker_drained(timeout=60)
    clock.lap("all final")
    report = check(system.database_url, oracle.dsn, recovery_window=30)
    true_cancelled = [row[0] for row in oracle.conn.execute("SELECT job_id FROM oracle_cancel WHERE result")]
    both = system.query("SELECT count(*) FROM timeouts_task WHERE status = %s AND job_id = ANY(%s)",
                        [Status.DONE, true_cancelled])[0][0]
    ran_and_cancelled = system.query("SELECT count(*) FROM timeouts_task WHERE status = %s AND job_id = ANY(%s)",
                                     [Status.CANCELLED, list(report.runs_by_job)])[0][0]
    print(f"\ncancel storm: {STORM_TASKS} tasks due over {STORM_SPAN:.0f} s, {len(spec['cancel'])} cancelled around "
          f"their due time ({len(moved)} rescheduled across partitions first): {clock}\n"
          f"  cancels {storm['cancels']}, cancel lag p50 {storm['cancel_lag_p50']:.2f} s max "
          f"{storm['cancel_lag_max']:.2f} s; rescheduled {storm.get('rescheduled', 0)}; 40001 retried: "
          f"{storm['provoked_40001']} in {len(provoked)} provoked moves, {storm['storm_40001']} in the storm; "
          f"dropped stale messages {system.log_count('timeouts: dropped stale message')}\n{report}")
    report.assert_clean()
    assert not storm["errors"], storm["errors"]
    assert both == 0 and ran_and_cancelled == 0, (both, ran_and_cancelled)
    assert report.counts["runs"] + report.counts["true cancels"] == STORM_TASKS
    assert all(p["moved"] and p["waited"] and p["cancel"] for p in storm["provoked"]), storm["provoked"]
    assert storm["provoked_40001"] >= len(provoked), "a cancel behind a cross-partition move saw no 40001"


@pytest.mark.reliability
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(timeout_for(120))
@pytest.mark.parametrize("on_conflict", ["error", "replace", "keep"])
def test_two_threads_scheduling_the_same_keys_leave_exactly_one_waiting_task_per_key(on_conflict):
    """Two threads schedule the same KEYS keys in the same order, each call its own transaction and
    connection: the advisory lock must serialise them so each key ends with one waiting task."""
    barrier = threading.Barrier(2)
    outcomes = [[], []]

    def schedule_all(side):
        try:
            barrier.wait(30)
            for key in range(KEYS):
                try:
                    task = TimeoutTask.objects.schedule("oracle.ok", f"k{key}", delay=3600, on_conflict=on_conflict)
                    outcomes[side].append(task.job_id)
                except timeouts.TaskConflict:
                    outcomes[side].append("conflict")
        finally:
            connection.close()

    threads = [threading.Thread(target=schedule_all, args=(side,)) for side in (0, 1)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    seconds = time.monotonic() - began
    assert all(len(side) == KEYS for side in outcomes), "a thread failed: see its exception above"
    rows = TimeoutTask.objects.filter(biz_type="oracle.ok", biz_id__startswith="k")
    waiting = rows.filter(status__in=[0, 1])
    per_key = {biz_id: n for biz_id, n in _counts(waiting)}
    conflicts = sum(outcome == "conflict" for side in outcomes for outcome in side)
    print(f"\non_conflict={on_conflict!r}: 2 threads x {KEYS} keys in {seconds:.1f} s; {rows.count()} rows, "
          f"{waiting.count()} waiting, {conflicts} conflicts")
    assert len(per_key) == KEYS and set(per_key.values()) == {1}
    if on_conflict == "error":
        assert conflicts == KEYS and rows.count() == KEYS
    elif on_conflict == "keep":
        assert outcomes[0] == outcomes[1] and rows.count() == KEYS
    else:  # replace: every call created a task and cancelled the one before it
        assert rows.count() == 2 * KEYS and rows.filter(status=Status.CANCELLED).count() == KEYS
    connections.close_all()


def _counts(queryset):
    from django.db.models import Count

    return queryset.values_list("biz_id").annotate(n=Count("job_id")).values_list("biz_id", "n")
