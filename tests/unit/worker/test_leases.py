"""The heartbeat that keeps leases alive (timeouts/worker/leases.py), and which processes a hard time limit
stops, without a database: the extensions themselves are tested end to end (tests/system)."""

import os

import pytest

from tests.support import processes
from timeouts.worker import leases

KEY = {"job_id": 1, "action_time": None}


def in_a_child(check) -> bool:
    """check() in a process forked from this one."""
    pid = os.fork()
    if pid == 0:
        os._exit(0 if check() else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def test_the_heartbeat_drops_a_lease_once_its_work_is_taken_over_without_a_statement():
    heartbeat = leases.Heartbeat()
    heartbeat.MIN_INTERVAL = 0.01
    heartbeat.add("default", KEY, 1, 0.03, keep=lambda: False)
    processes.wait_for(lambda: not heartbeat.leases, 5, interval=0.01, message="the lease dropped")


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python 3.12+: forking with threads
def test_a_forked_process_keeps_none_of_its_parents_leases():
    """A prefork pool process forked while the main process keeps the leases of calls started ahead
    must not extend them: the main process stops when a pool process takes a call over."""
    heartbeat = leases.Heartbeat()
    heartbeat.add("default", KEY, 1, 60)
    assert in_a_child(lambda: not heartbeat.leases and heartbeat.thread is None)
    assert len(heartbeat.leases) == 1  # the parent's own


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_only_a_prefork_pool_process_stops_a_handler_at_its_time_limit(monkeypatch):
    monkeypatch.setattr(leases, "_worker_pid", None)
    monkeypatch.setattr(leases, "_in_pool_process", False)
    assert leases.pool_stops_handlers()  # not in a worker: an eager task, without a lease to outlive
    leases._in_a_worker()  # worker_init, in the worker's main process
    assert not leases.pool_stops_handlers()  # threads, gevent, eventlet
    leases._in_a_pool_process()  # the solo pool sends worker_process_init in the main process
    assert not leases.pool_stops_handlers()

    def in_a_prefork_pool_process():
        leases._in_a_pool_process()
        return leases.pool_stops_handlers()

    assert in_a_child(in_a_prefork_pool_process)
