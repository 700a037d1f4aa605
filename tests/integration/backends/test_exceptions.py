"""TimeoutsBackend with exceptions that are hard to keep: constructors with unusual arguments,
exceptions that cannot be pickled or whose class cannot be imported, groups, cycles, NUL, and
BaseExceptions. Each failed attempt's error is its class path and traceback, read back with
get_result(); nothing has to be pickled, imported again or rebuilt. The tasks run in this process as
a worker runs them (tests/integration/backends/test_backend.py's helpers)."""

import asyncio
import pickle
import sys
import threading

import pytest
from django.db import DataError, connection

from tests.integration.backends.test_backend import make_due_now, run_due
from timeouts.backends.compat import TaskResultStatus, task_finished
from timeouts.models import TimeoutTask
from timeouts.worker.attempt import MAX_ERROR_LENGTH

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]
Status = TimeoutTask.Status
HERE = __name__


class KeywordsOnlyError(Exception):
    """Its constructor takes required keyword-only arguments and hands none to Exception: pickle
    cannot rebuild it (it calls the class with `args`, which is empty)."""

    def __init__(self, *, order, reasons):
        super().__init__()
        self.order = order
        self.reasons = reasons

    def __str__(self):
        return f"order {self.order} refused: {', '.join(self.reasons)}"


class HoldsALockError(Exception):
    """An attribute pickle cannot dump."""

    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


def cycle():
    first, second = ValueError("first"), KeyError("second")
    first.__context__, second.__context__ = second, first
    return first


@task
def raise_(kind):
    if kind == "keywords":
        raise KeywordsOnlyError(order=7, reasons=["no stock", "card declined"])
    if kind == "lock":
        raise HoldsALockError("cannot be pickled")
    if kind == "local":
        class DefinedInTheTaskError(Exception):
            pass

        raise DefinedInTheTaskError("its class exists only in this call")
    if kind == "group":
        raise ExceptionGroup("two things failed", [ValueError("first"), KeyError("second")])
    if kind == "cycle":
        raise cycle()
    if kind == "long":
        raise ValueError("x" * (3 * MAX_ERROR_LENGTH) + "the end")
    if kind == "nul":
        raise ValueError("a\x00b")
    if kind == "exit":
        sys.exit(3)
    if kind == "interrupt":
        raise KeyboardInterrupt
    raise AssertionError(kind)


@task
async def async_cancelled():
    raise asyncio.CancelledError("cancelled inside the task")


def local_error_class_path():
    return f"{HERE}.raise_.<locals>.DefinedInTheTaskError"


def test_the_test_exceptions_are_what_they_claim():
    with pytest.raises(TypeError):
        pickle.loads(pickle.dumps(KeywordsOnlyError(order=1, reasons=[])))
    with pytest.raises(TypeError):
        pickle.dumps(HoldsALockError("x"))


@pytest.mark.parametrize(("kind", "class_path", "in_traceback"), [
    ("keywords", f"{HERE}.KeywordsOnlyError", "order 7 refused: no stock, card declined"),
    ("lock", f"{HERE}.HoldsALockError", "cannot be pickled"),
    ("group", "builtins.ExceptionGroup", "KeyError: 'second'"),
    ("cycle", "builtins.ValueError", "KeyError: 'second'"),
])
def test_an_exception_that_cannot_be_rebuilt_is_recorded_as_its_class_and_traceback(kind, class_path, in_traceback):
    result = raise_.enqueue(kind)
    assert run_due() == ["dead"]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished and result.finished_at is not None
    [error] = result.errors
    assert error.exception_class_path == class_path and in_traceback in error.traceback
    assert error.exception_class.__qualname__ == class_path.rsplit(".", 1)[1]


def test_an_exception_whose_class_cannot_be_imported_is_still_read_back():
    result = raise_.enqueue("local")
    assert run_due() == ["dead"]
    fetched = raise_.get_result(result.id)
    assert fetched.status == TaskResultStatus.FAILED
    [error] = fetched.errors
    assert error.exception_class_path == local_error_class_path()
    assert "its class exists only in this call" in error.traceback
    with pytest.raises(ImportError):
        error.exception_class  # noqa: B018  (Django imports it only when asked)


def test_a_traceback_longer_than_the_limit_keeps_its_end():
    result = raise_.enqueue("long")
    assert run_due() == ["dead"]
    result.refresh()
    [error] = result.errors
    assert len(error.traceback) == MAX_ERROR_LENGTH and error.traceback.rstrip().endswith("the end")


def test_each_attempt_keeps_its_own_complex_exception():
    result = raise_.using(backend="retrying").enqueue("keywords")
    run_due()
    with connection.cursor() as cursor:  # the next attempts raise another kind
        cursor.execute("UPDATE timeouts_task SET attribute = jsonb_set(attribute, '{args}', '[\"local\"]')")
    make_due_now(result)
    run_due()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE timeouts_task SET attribute = jsonb_set(attribute, '{args}', '[\"lock\"]')")
    make_due_now(result)
    assert run_due() == ["dead"]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 3
    assert [e.exception_class_path for e in result.errors] == [
        f"{HERE}.KeywordsOnlyError", local_error_class_path(), f"{HERE}.HoldsALockError"]


def test_task_finished_carries_the_complex_exception():
    seen = []

    def receiver(sender, task_result, **kwargs):
        if task_result.task.func.__module__ == HERE:
            seen.append((task_result.status, [e.exception_class_path for e in task_result.errors]))

    task_finished.connect(receiver)
    try:
        raise_.enqueue("keywords")
        run_due()
    finally:
        task_finished.disconnect(receiver)
    assert seen == [(TaskResultStatus.FAILED, [f"{HERE}.KeywordsOnlyError"])]


def run_due_letting_through(*exceptions):
    """run_due(), or the exception of one of these types that came out of it."""
    try:
        return run_due()
    except exceptions as exc:
        return exc


def test_an_exception_message_with_nul_fails_the_task_with_its_class():
    result = raise_.enqueue("nul")
    outcome = run_due_letting_through(DataError)
    result.refresh()
    assert (outcome, result.status) == (["dead"], TaskResultStatus.FAILED)
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"


def test_a_task_that_calls_sys_exit_fails_as_djangos_backends_record_it():
    result = raise_.enqueue("exit")
    outcome = run_due_letting_through(SystemExit)
    result.refresh()
    assert (outcome, result.status) == (["dead"], TaskResultStatus.FAILED)
    assert [e.exception_class_path for e in result.errors] == ["builtins.SystemExit"]


def test_an_async_task_cancelled_inside_fails_with_cancelled_error():
    result = async_cancelled.enqueue()
    outcome = run_due_letting_through(asyncio.CancelledError)
    result.refresh()
    assert (outcome, result.status) == (["dead"], TaskResultStatus.FAILED)
    assert [e.exception_class_path for e in result.errors] == ["asyncio.exceptions.CancelledError"]


def test_a_task_that_calls_sys_exit_is_retried_as_any_failure():
    result = raise_.using(backend="retrying").enqueue("exit")
    assert run_due() == ["retry"]
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.READY, 1)
    assert [e.exception_class_path for e in result.errors] == ["builtins.SystemExit"]


def pool_process_terminating(monkeypatch):
    """As in a pool process whose SIGTERM handler has run: billiard sets this flag, then raises
    SystemExit wherever the process was."""
    from billiard import common
    monkeypatch.setattr(common, "_should_have_exited", [True])


@pytest.mark.parametrize(("kind", "stopping", "expected"), [
    ("interrupt", None, KeyboardInterrupt),
    ("exit", pool_process_terminating, SystemExit),
    ("keywords", pool_process_terminating, KeywordsOnlyError),  # a cleanup's error while it unwinds
])
def test_the_worker_stopping_leaves_the_attempt_to_its_lease_without_an_error(kind, stopping, expected, monkeypatch):
    result = raise_.enqueue(kind)
    if stopping:
        stopping(monkeypatch)
    with pytest.raises(expected):
        run_due()
    monkeypatch.undo()
    result.refresh()
    assert (result.status, result.errors) == (TaskResultStatus.RUNNING, [])
    row = TimeoutTask.objects.get()
    assert (row.status, row.last_error) == (Status.RUNNING, "")
