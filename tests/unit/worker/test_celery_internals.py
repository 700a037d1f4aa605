"""What timeouts/worker/celery_internals.py relies on, in the Celery, kombu and billiard installed:
each test names the entry of that module to check again when it fails."""

import inspect
from importlib.metadata import version
from types import SimpleNamespace

import billiard.common
import billiard.pool
import billiard.process
import pytest
from celery import Celery
from celery.worker import components
from celery.worker.consumer.consumer import Consumer
from celery.worker.request import create_request_cls
from celery.worker.worker import WorkController

from timeouts.durable.starts import StartingRequest
from timeouts.worker import celery_internals, priority

MODULE = "timeouts/worker/celery_internals.py"


@pytest.mark.parametrize("package", sorted(celery_internals.CHECKED))
def test_the_installed_versions_are_those_the_module_was_checked_against(package):
    installed, checked = version(package), celery_internals.CHECKED[package]
    assert installed == checked, (
        f"{package} {installed} is installed, {MODULE} was checked against {checked}: check each of its "
        "entries against this version (the other tests here say which no longer holds), then update CHECKED "
        "and the versions its docstring names")


@pytest.fixture
def prefork_worker():
    """A prefork worker of its own app, built as `celery worker` builds it (not started: no process is
    forked), with the step that on-time work first adds."""
    app = Celery("internals", broker="memory://", set_as_current=False, fixups=[])
    app.steps["worker"].add(priority.OnTimeFirst)
    worker = app.WorkController(pool_cls="prefork", concurrency=2, use_eventloop=True, without_mingle=True,
                                without_gossip=True, without_heartbeat=True)
    yield worker
    priority._intake = None


def test_1_a_prefork_workers_consumer_hands_its_requests_to_the_intake(prefork_worker):
    assert priority._intake is not None and prefork_worker.consumer.on_task_request == priority._intake.take, (
        f"entry 1 of {MODULE}: Celery's consumer no longer gets its requests from WorkController.process_task "
        "as set between the Pool step and the Consumer step; on-time work no longer goes first")


def test_1_celery_still_makes_prefork_requests_wait_on_the_workers_semaphore():
    source = inspect.getsource(components.Pool.create)
    assert "w.pool_putlocks and w.pool_cls.uses_semaphore" in source and "w._process_task_sem" in source, (
        f"entry 1 of {MODULE}: components.Pool.create no longer picks _process_task_sem under the condition "
        "that takes_requests_through_semaphore() copies")
    assert "self._quick_acquire(self._process_task" in inspect.getsource(WorkController._process_task_sem)


def test_1_a_lost_connection_still_clears_the_semaphore_before_the_consumers_steps_stop():
    assert "self.controller.semaphore.clear()" in inspect.getsource(Consumer.on_close), (
        f"entry 1 of {MODULE}: Consumer.on_close no longer clears the worker's semaphore, which the step "
        "ForgetAsks (priority.py) follows by forgetting the requests waiting in the intake")


def test_1_other_pools_keep_celerys_way(prefork_worker):
    app = prefork_worker.app
    threads = app.WorkController(pool_cls="threads", concurrency=2, without_mingle=True, without_gossip=True,
                                 without_heartbeat=True)
    assert priority._intake is None and threads.consumer.on_task_request == threads.process_task


def test_2_hand_to_pool_does_what_celerys_own_does():
    source = inspect.getsource(WorkController._process_task)
    assert "req.execute_using_pool(self.pool)" in source and "except TaskRevokedError" in source \
        and "self._quick_release()" in source, (
            f"entry 2 of {MODULE}: WorkController._process_task changed; make hand_to_pool() do what it does")
    assert "w._quick_release = w.semaphore.release" in inspect.getsource(components.Pool.create)


def test_3_billiard_pool_processes_still_read_their_count_under_its_lock():
    assert "on_ready_counter" in inspect.signature(billiard.pool.Worker).parameters, (
        f"entry 3 of {MODULE}: billiard's pool Worker no longer takes on_ready_counter")
    assert "self.on_ready_counter.value" in inspect.getsource(billiard.pool.Worker._ensure_messages_consumed), (
        f"entry 3 of {MODULE}: billiard's Worker._ensure_messages_consumed no longer reads on_ready_counter.value")


def test_3_a_billiard_process_keeps_the_worker_it_runs_as_its_target():
    def target():
        pass

    assert billiard.process.BaseProcess(target=target)._target is target, (
        f"entry 3 of {MODULE}: billiard's Process no longer keeps its target in _target, through which "
        "pool_process_worker() finds a pool process's Worker")


def test_4_billiard_tells_whether_its_sigterm_handler_fired():
    assert hasattr(billiard.common, "terminate_handler_fired") or hasattr(billiard.common, "_should_have_exited"), (
        f"entry 4 of {MODULE}: billiard.common has neither terminate_handler_fired() nor _should_have_exited")
    assert celery_internals.terminate_handler_fired() is False


def test_5_the_request_class_celery_makes_for_a_durable_task_still_hands_over_its_start():
    task = SimpleNamespace(time_limit=None, soft_time_limit=None, acks_late=True)
    made = create_request_cls(StartingRequest, task, SimpleNamespace(apply_async=None), "host", None,
                              app=SimpleNamespace(use_fast_trace_task=False))
    assert "execute_using_pool" in vars(made), (
        f"entry 5 of {MODULE}: Celery's per-task Request no longer has an execute_using_pool of its own; "
        "StartingRequest.__init_subclass__ (durable/starts.py) may no longer be needed")
    assert "__init_subclass__" in made.execute_using_pool.__qualname__, (
        f"entry 5 of {MODULE}: the execute_using_pool Celery made for a DurableTask no longer hands over the "
        "start recorded ahead (StartingRequest.__init_subclass__ did not wrap it)")
    assert made.on_accepted is StartingRequest.on_accepted, (
        f"entry 5 of {MODULE}: Celery's per-task Request now has an on_accepted of its own, which does not let "
        "the lease of a start handed over go when a pool process accepts the call")


def test_6_celerys_default_strategy_still_does_what_the_unpacking_strategy_does_for_each_call():
    from celery.worker import strategy

    source = inspect.getsource(strategy.default)
    for used in ("consumer.timer.call_at", "consumer.qos.increment_eventually", "consumer.task_buckets",
                 "consumer._limit_task", "consumer.on_task_request", "consumer.controller.state.revoked",
                 "consumer.event_dispatcher", "consumer.disable_rate_limits", "task_scheduled(req)",
                 "create_request_cls(Request, task, consumer.pool, hostname, eventer", "signals.task_received.send",
                 "'task-received'"):
        assert used in source, f"{MODULE}, entry 6: Celery's default strategy no longer does {used}"
    assert "task_reserved(task)" in inspect.getsource(Consumer.apply_eta_task)
    for method in ("on_invalid_task", "on_unknown_task", "_limit_task"):
        assert callable(getattr(Consumer, method, None)), f"{MODULE}, entry 6: Consumer.{method} is gone"
