"""Processes that die or lie, checked by the oracle: a dispatcher killed between its claim's commit
and the publish, a publish that succeeded but reported failure, worker processes killed mid-handler,
a task that kills its own process, and old messages replayed onto the queue.

Each scenario runs the system (Celery prefork workers, dispatchers, a scan loop every SCAN_INTERVAL)
on a throwaway PostgreSQL and the tests' Redis database, and ends with the oracle's check().
"""

import time

import pytest

from tests.support import processes
from tests.testapp.oracle_handlers import OK_TTR, POISON_MAX_ATTEMPTS
from timeouts.states import Status

from .oracle import check

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

SCAN_INTERVAL = 1.0  # the System's default: the scan loop's period in every scenario here
RECOVERY_WINDOW = 30  # seconds after which a due task that is not final counts as stuck (or lost)
DROPPED = "timeouts: dropped stale message"  # the worker's log line for a message its compare-and-set refused
DONE, DEAD = 2, 5


def start(system, *, dispatcher_faults=None, scanner_faults=None, worker_env=None, concurrency=2):
    worker = system.worker(concurrency=concurrency, env=worker_env)
    system.dispatcher(faults=dispatcher_faults)
    system.scanner(faults=scanner_faults)
    system.wait_worker_ready(worker)
    return worker


def settle(system, job_ids, timeout=120):
    system.wait_until_final(timeout, job_ids)
    system.wait_broker_drained(60)


@pytest.mark.timeout(300)
def test_a_dispatcher_killed_between_claim_commit_and_publish_20_times_loses_nothing(system, scheduler, oracle):
    kills, slots, slack = 20, 3, 3.0
    start(system)
    job_ids, dispatchers, orphans = [], [], {}
    next_feed = time.monotonic()

    def watch_orphans():
        """Claims left without a message: DISPATCHED for longer than any published one waits (the
        lease keeps them so for TTR). A task may be orphaned twice: recovered, then claimed again
        by the next dispatcher to die."""
        for job, claimed_at in system.query("SELECT job_id, dispatched_at FROM timeouts_task WHERE status = %s "
                                            "AND dispatched_at < clock_timestamp() - interval '3 seconds'",
                                            [Status.DISPATCHED]):
            orphans.setdefault(job, set()).add(claimed_at)

    def feed_and_respawn():
        """A task due every 0.3 s, and `slots` dispatchers that die at their first non-empty claim."""
        nonlocal next_feed
        if time.monotonic() >= next_feed:
            job_ids.append(scheduler.schedule("oracle.ok", len(job_ids), delay=1.0))
            next_feed += 0.3
        for slot in range(slots):
            if slot == len(dispatchers) or dispatchers[slot].poll() is not None:
                process = system.may_exit(system.dispatcher(f"dispatcher-{slot}", faults="claim.after_commit=exit"))
                dispatchers[slot:slot + 1] = [process]
        watch_orphans()
        system.check_alive()
        return len(system.fired("claim.after_commit")) >= kills

    processes.wait_for(feed_and_respawn, 180, interval=0.1, message=f"{kills} dispatcher deaths")
    for process in dispatchers:
        system.stop(process)
    processes.wait_for(lambda: watch_orphans() or not system.unfinished(job_ids), 120, interval=0.2,
                       message="every task to be final")
    system.wait_broker_drained(60)

    report = check(system.database_url, oracle.dsn, recovery_window=RECOVERY_WINDOW)
    lateness = {job: (runs[0]["ran_at"] - max(orphans.get(job, [runs[0]["action_time"]]))).total_seconds()
                for job, runs in report.runs_by_job.items()}
    worst = max((lateness[job], job) for job in orphans)
    print(report, f"\n  {len(system.fired('claim.after_commit'))} deaths orphaned "
                  f"{sum(map(len, orphans.values()))} claims of {len(orphans)} tasks; the slowest started "
                  f"{worst[0]:.2f} s after its orphaned claim (job {worst[1]})")
    report.assert_clean()
    assert report.counts["runs"] == len(job_ids)
    assert sum(map(len, orphans.values())) >= kills
    # An orphaned claim waits out its lease (TTR) and the next scan, and no longer; the others are
    # published at once (by a dispatcher that lived long enough, or by the scan).
    assert all(lateness[job] <= OK_TTR + SCAN_INTERVAL + slack for job in orphans), sorted(lateness.values())[-5:]
    assert all(lateness[job] <= SCAN_INTERVAL + slack for job in set(job_ids) - set(orphans))


@pytest.mark.timeout(300)
def test_a_publish_that_worked_but_reported_failure_starts_no_handler_twice(system, scheduler, oracle):
    # Half the sends succeed and then raise: publish() releases the claim although its message is
    # in the broker, and the task is claimed and published again: two messages for one attempt.
    faults = "publish.after_send=raise@0.5"
    start(system, dispatcher_faults=faults, scanner_faults=faults)
    job_ids = scheduler.schedule_many([{"biz_type": "oracle.ok", "biz_id": i, "delay": 1 + i * 0.1}
                                       for i in range(60)])
    settle(system, job_ids)

    report = check(system.database_url, oracle.dsn, recovery_window=RECOVERY_WINDOW)
    fired, dropped = len(system.fired("publish.after_send")), system.log_count(DROPPED)
    print(report, f"\n  faults fired {fired}, stale messages dropped {dropped}")
    report.assert_clean(max_duplicates=0)
    assert report.counts["runs"] == len(job_ids)
    # Each firing put one message too many in the broker; the compare-and-set dropped every one.
    assert fired >= 10 and dropped >= fired


@pytest.mark.timeout(300)
def test_killed_worker_processes_lose_nothing_and_rerun_only_what_was_in_flight(system, scheduler, oracle):
    # Redis gives a dead worker's unacknowledged messages to another worker after 10 s.
    env = {"TIMEOUTS_TEST_VISIBILITY_TIMEOUT": 10}
    first = start(system, worker_env=env)
    slow = scheduler.schedule_many([{"biz_type": "oracle.slow", "biz_id": f"slow-{i}", "delay": 0.5,
                                     "attribute": {"sleep": 3}} for i in range(4)])
    job_ids = slow + scheduler.schedule_many([{"biz_type": "oracle.ok", "biz_id": i, "delay": 1 + i * 0.3}
                                              for i in range(30)])
    in_flight = set()

    def running_in_pool(exclude=()):
        children = set(system.children(first))
        running = _running_jobs(system)
        return [(run["job_id"], run["pid"]) for job in slow for run in oracle.runs(job)
                if run["pid"] in children and job in running and job not in exclude]

    # A pool process killed mid-handler: Celery requeues its message (acks_late, reject_on_worker_lost).
    [(victim_job, victim_pid), *_] = processes.wait_for(running_in_pool, 60, message="a slow handler running")
    in_flight |= _running_jobs(system)
    system.kill(victim_pid)
    # Then the worker's main process, while a pool process runs another handler: its messages stay
    # unacknowledged in Redis until the visibility timeout.
    processes.wait_for(lambda: running_in_pool(exclude={victim_job}), 60, message="another slow handler running")
    in_flight |= _running_jobs(system)
    unacked = system.unacked()
    pool = system.children(first)
    system.kill(system.may_exit(first))
    # Celery's pool processes die with their parent (PR_SET_PDEATHSIG): one may die between its
    # task's start commit and the handler's first line, leaving that task RUNNING, its attempt
    # counted and no run recorded, until its lease runs out. Such a task was in flight too.
    processes.wait_for(lambda: system.all_gone(pool), 10, interval=0.05, message="the pool processes to die")
    in_flight |= _running_jobs(system)
    second = system.worker("worker-2", env=env)
    system.wait_worker_ready(second)

    system.wait_until_final(120, job_ids)
    processes.wait_for(lambda: not unacked & system.unacked(), 60, interval=0.5,
                       message="Redis to redeliver the dead worker's messages")
    system.wait_broker_drained(60)

    report = check(system.database_url, oracle.dsn, recovery_window=RECOVERY_WINDOW)
    print(report, f"\n  in flight at the kills: {sorted(in_flight)}; unacked at the main kill: {len(unacked)}; "
                  f"stale messages dropped {system.log_count(DROPPED)}")
    # Only a task in flight at a kill may have started and never reached its handler.
    report.assert_clean(max_duplicates=len(in_flight), ignore=("accounting",))
    report.unstarted_attempts()
    assert {job for job, _what in report.accounting} <= in_flight, report.accounting
    assert unacked and victim_job in in_flight
    assert max(len(runs) for runs in report.runs_by_job.values()) <= 2  # no third run after the redelivery
    assert {job for job, _extra in report.duplicates} <= in_flight


def _running_jobs(system) -> set:
    return {job for (job,) in system.query("SELECT job_id FROM timeouts_task WHERE status = %s", [Status.RUNNING])}


@pytest.mark.timeout(300)
def test_a_poison_task_is_dead_after_exactly_max_attempts_and_harms_no_other_task(system, scheduler, oracle):
    start(system)
    poison = scheduler.schedule("oracle.poison", "poison", delay=0.5)
    others = scheduler.schedule_many([{"biz_type": "oracle.ok", "biz_id": i, "delay": 0.5 + i * 0.3}
                                      for i in range(40)])
    settle(system, [poison, *others])

    report = check(system.database_url, oracle.dsn, recovery_window=RECOVERY_WINDOW)
    print(report)
    report.assert_clean()
    [(status, attempts)] = system.query("SELECT status, attempts FROM timeouts_task WHERE job_id = %s", [poison])
    assert (status, attempts) == (DEAD, POISON_MAX_ATTEMPTS)
    assert sorted(run["attempt"] for run in report.runs_by_job[poison]) == list(range(1, POISON_MAX_ATTEMPTS + 1))
    assert all(len(report.runs_by_job[job]) == 1 for job in others) and report.counts["done"] == len(others)


@pytest.mark.timeout(300)
def test_replayed_messages_of_run_cancelled_and_stale_tasks_start_nothing(system, scheduler, oracle):
    start(system)
    ran = scheduler.schedule_many([{"biz_type": "oracle.ok", "biz_id": i, "delay": 0.5} for i in range(250)])
    later = scheduler.schedule_many([{"biz_type": "oracle.ok", "biz_id": f"later-{i}", "delay": 3600}
                                     for i in range(500)])
    cancelled, waiting = later[:250], later[250:]
    assert all(scheduler.cancel(job) for job in cancelled)
    settle(system, ran)
    assert oracle.run_count() == len(ran)

    action_times = dict(system.query("SELECT job_id, action_time FROM timeouts_task"))
    # Already run (its attempt, and the next one), cancelled, and not due yet (a stale dispatch).
    replay = ([(job, 1) for job in ran] + [(job, 2) for job in ran] + [(job, 1) for job in cancelled]
              + [(job, 1) for job in waiting])
    assert len(replay) == 1000
    dropped_before, since = system.log_count(DROPPED), oracle.now()
    with system.app.producer_or_acquire() as producer:
        for job, attempt in replay:
            # No partition: the worker looks the row up through the parent table.
            system.app.send_task("timeouts.run", args=[job, action_times[job].isoformat(), attempt, None],
                                 producer=producer)
    processes.wait_for(lambda: system.log_count(DROPPED) - dropped_before >= len(replay), 180, interval=0.5,
                       message="every replayed message to be dropped")
    system.wait_broker_drained(60)

    assert oracle.run_count(since=since) == 0
    report = check(system.database_url, oracle.dsn, recovery_window=RECOVERY_WINDOW)
    print(report)
    report.assert_clean()
    assert report.counts["runs"] == len(ran) and report.counts["waiting"] == len(waiting)
    assert system.log_count(DROPPED) - dropped_before == len(replay)
