"""The system's PostgreSQL fails under load: a crash-restart, an outage, and sessions terminated
again and again. Each test runs its own throwaway cluster (its own port) and checks with the
oracle that no committed task is lost, none starts early or twice for one attempt, and that the
dispatcher comes back (LISTEN again) within seconds of the database.

Sizes follow TIMEOUTS_RELIABILITY_SCALE (1.0: 8,000 tasks and a 15 s outage, in which the dispatcher's
attempts to reconnect reach their longest wait, 5 s, and go on at it). Run with -s
to see what each test observed; the numbers also go to var/test-logs/reliability/<test>/numbers.json.
"""

import pytest

from tests.support.processes import wait_for

from .oracle import check
from .outages import (
    ENV,
    WORKER,
    BackendKiller,
    BurstScheduler,
    Timeline,
    app_url,
    listeners,
    scaled,
    sleep_checking,
)

pytestmark = pytest.mark.reliability

RESUME_WITHIN = 10.0  # seconds after the database accepts connections again


def run_fraction(oracle, total, fraction):
    return lambda: oracle.run_count() >= fraction * total


def wait_back(system, sut, timeline, label, listener_before):
    """After the database came back: seconds until a new LISTEN session and until the first claim."""
    up = timeline.marks[label]

    def listening_again():
        pids = listeners(sut.admin_url)
        return pids and set(pids) != set(listener_before) and pids

    pids = wait_for(listening_again, RESUME_WITHIN + 5, interval=0.1, message="the dispatcher to LISTEN again")
    listen_after = round((timeline.oracle.now() - up).total_seconds(), 3)

    def first_claim():
        return system.query("SELECT min(dispatched_at) FROM timeouts_task WHERE dispatched_at > %s", [up])[0][0]

    claimed = wait_for(first_claim, RESUME_WITHIN + 5, interval=0.1, message="a claim after the restart")
    return pids, listen_after, round((claimed - up).total_seconds(), 3)


def probe_listen(system, scheduler, oracle, count=3):
    """With the scan loop stopped, tasks scheduled one at a time, due 1 s later, can only fire on time
    if the dispatcher's LISTEN works (otherwise it finds them at its next 10 s read)."""
    system.wait_broker_drained(timeout=120)  # no stale message queued ahead of the probes
    lateness = []
    for i in range(count):
        job_id = scheduler.schedule("oracle.ok", f"probe{i}", delay=1.0)
        system.wait_until_final(timeout=30, job_ids=[job_id])
        run = oracle.runs(job_id)[0]
        lateness.append(round((run["ran_at"] - run["action_time"]).total_seconds(), 3))
    return lateness


@pytest.mark.timeout(900)
def test_postgres_crash_and_outage_during_a_burst_lose_nothing(system, sut_database, scheduler, oracle, log_dir):
    total, outage = scaled(8_000, 500), scaled(15, 5)
    timeline = Timeline(oracle, log_dir, "postgres crash + outage")
    worker = system.worker(**WORKER, env=ENV)
    system.dispatcher(env=ENV)
    scanner = system.scanner(interval=1, env=ENV)
    system.wait_worker_ready(worker)
    burst = BurstScheduler(sut_database.url, oracle.dsn, total, delay=(0.2, 2.0))
    burst.start()
    timeline.mark("burst")

    # 1. A crash (pg_ctl -m immediate) a quarter of the way through: recovery at the next start.
    wait_for(run_fraction(oracle, total, 0.25), 600, interval=0.5, message="a quarter of the burst to run")
    before = listeners(sut_database.admin_url)
    runs_at_crash = oracle.run_count()
    timeline.mark("crash")
    sut_database.restart("immediate")
    timeline.mark("crash_up")
    crash_listeners, crash_listen_s, crash_claim_s = wait_back(system, sut_database, timeline, "crash_up", before)
    crash_first_run_s = timeline.first_run_after("crash_up", 60)

    # 2. An outage: down (immediate) for `outage` seconds, from the middle of the burst.
    wait_for(run_fraction(oracle, total, 0.5), 600, interval=0.5, message="half of the burst to run")
    before = listeners(sut_database.admin_url)
    runs_at_outage = oracle.run_count()
    timeline.mark("outage")
    sut_database.stop("immediate")
    sleep_checking(system, outage)
    sut_database.start()
    timeline.mark("outage_up")
    outage_listeners, outage_listen_s, outage_claim_s = wait_back(system, sut_database, timeline, "outage_up", before)
    outage_first_run_s = timeline.first_run_after("outage_up", 60)

    burst.join_checked(600)
    system.wait_until_final(timeout=900)
    timeline.mark("final")
    system.stop(scanner)
    probe = probe_listen(system, scheduler, oracle)
    report = check(system.database_url, oracle.dsn, recovery_window=30)
    print(report)
    unstarted = report.unstarted_attempts()
    timeline.numbers(
        tasks=burst.committed, scheduling_chunks_failed=burst.failed_chunks, runs=report.counts["runs"],
        runs_at_crash=runs_at_crash, runs_at_outage=runs_at_outage, outage_s=outage,
        crash={"listen_again_s": crash_listen_s, "first_claim_s": crash_claim_s, "first_run_s": crash_first_run_s,
               "backlog_done_s": timeline.backlog_done_after("crash_up")},
        outage={"listen_again_s": outage_listen_s, "first_claim_s": outage_claim_s,
                "first_run_s": outage_first_run_s, "backlog_done_s": timeline.backlog_done_after("outage_up")},
        listeners_after=[crash_listeners, outage_listeners],
        dispatcher_reconnects=system.log_count("timeouts.dispatcher: reconnected"),
        duplicates=report.duplicate_runs, unstarted_attempts=unstarted, probe_lateness_s=probe,
        lateness=timeline.lateness(report), unknown_commits=report.counts["unknown"],
    )
    # At least once: a run whose DONE the crash lost (or that could not write it) runs again.
    report.assert_clean(max_duplicates=total // 100, ignore=("accounting",))
    assert report.counts["jobs run"] == report.counts["committed"] - report.counts["true cancels"]
    assert crash_listen_s <= RESUME_WITHIN and outage_listen_s <= RESUME_WITHIN
    assert crash_claim_s <= RESUME_WITHIN and outage_claim_s <= RESUME_WITHIN
    assert max(probe) < 1.0, f"the dispatcher does not hear NOTIFY after the restarts: lateness {probe}"


@pytest.mark.timeout(600)
def test_terminated_sessions_reconnect_and_lose_nothing(system, sut_database, scheduler, oracle, log_dir):
    total = scaled(3_000, 300)  # scheduled over 15 s: kills every 3 s, the workers' every 7 s
    timeline = Timeline(oracle, log_dir, "pg_terminate_backend")
    url = sut_database.url
    worker = system.worker(**WORKER, env={**ENV, "DATABASE_URL": app_url(url, "timeouts-worker")})
    system.dispatcher(env={**ENV, "DATABASE_URL": app_url(url, "timeouts-dispatcher-claims")})
    scanner = system.scanner(interval=1, env={**ENV, "DATABASE_URL": app_url(url, "timeouts-scan")})
    system.wait_worker_ready(worker)
    # The dispatcher's LISTEN session and claim session and the scan's session every 3 s; the
    # workers' sessions every 7 s (a run whose DONE cannot be written then runs again).
    killer = BackendKiller(sut_database.admin_url, ["timeouts-dispatcher", "timeouts-dispatcher-claims",
                                                     "timeouts-scan"], interval=3.0)
    worker_killer = BackendKiller(sut_database.admin_url, ["timeouts-worker"], interval=7.0)
    burst = BurstScheduler(url, oracle.dsn, total, delay=(0.2, 2.0), rate=200)
    killer.start()
    worker_killer.start()
    burst.start()
    try:
        burst.join_checked(600)
        system.wait_until_final(timeout=600)
    finally:
        killer.finish()
        worker_killer.finish()
    timeline.mark("final")
    system.stop(scanner)
    probe = probe_listen(system, scheduler, oracle)
    report = check(system.database_url, oracle.dsn, recovery_window=30)
    print(report)
    unstarted = report.unstarted_attempts()
    sessions = {name: len(pids) for name, pids in {**killer.seen, **worker_killer.seen}.items()}
    timeline.numbers(
        tasks=burst.committed, runs=report.counts["runs"], kill_rounds=killer.rounds + worker_killer.rounds,
        terminated={**killer.kills, **worker_killer.kills}, distinct_sessions_seen=sessions,
        dispatcher_reconnects=system.log_count("timeouts.dispatcher: reconnected"), duplicates=report.duplicate_runs,
        unstarted_attempts=unstarted, probe_lateness_s=probe, lateness=timeline.lateness(report),
    )
    report.assert_clean(max_duplicates=worker_killer.kills["timeouts-worker"], ignore=("accounting",))
    assert killer.kills["timeouts-dispatcher"] >= 3 and killer.kills["timeouts-scan"] >= 3
    # Each terminated LISTEN session was replaced: the dispatcher logged a reconnect for it.
    assert system.log_count("timeouts.dispatcher: reconnected") >= killer.kills["timeouts-dispatcher"]
    assert len(listeners(sut_database.admin_url)) == 1
    assert max(probe) < 1.0, f"the dispatcher does not hear NOTIFY after reconnecting: lateness {probe}"
