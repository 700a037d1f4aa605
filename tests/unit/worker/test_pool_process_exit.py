"""A pool process on its way out waits for its last result without the lock its worker's main
process takes for every result (timeouts/worker/pool_process_exit.py): killed while holding it, it would
leave the main process waiting forever. Run against billiard itself, whose behaviour this relies on
(the version it was checked against: tests/unit/worker/test_celery_internals.py)."""

import threading

import billiard
import pytest
from billiard.pool import Pool, Worker

from timeouts.worker import celery_internals, pool_process_exit


@pytest.fixture
def count_locked_elsewhere():
    """A pool process's count, as billiard's Pool makes it, whose lock another holder keeps (as a
    process killed while holding it would), until the test ends."""
    count = billiard.get_context().Value("i")
    held, done = threading.Event(), threading.Event()

    def hold():
        with count.get_lock():
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    yield count
    done.set()
    holder.join(5)


def test_a_pool_process_on_its_way_out_waits_for_its_last_result_without_the_lock(count_locked_elsewhere):
    context = billiard.get_context()
    worker = Worker(context.SimpleQueue(), context.SimpleQueue(), on_ready_counter=count_locked_elsewhere)
    celery_internals.read_count_without_lock(worker)
    outcome = []
    waiting = threading.Thread(target=lambda: outcome.append(worker._ensure_messages_consumed(completed=0)))
    waiting.start()
    waiting.join(2)
    assert outcome == [True], "the pool process waited for the lock its main process needs"


def count_read_by_this_process():
    return type(billiard.process.current_process()._target.on_ready_counter).__name__


def test_each_pool_process_reads_its_count_without_the_lock():
    pool = Pool(processes=1, initializer=pool_process_exit.in_each_pool_process)
    try:
        assert pool.apply_async(count_read_by_this_process).get(timeout=30) == "_UnlockedCount"
    finally:
        pool.terminate()
        pool.join()
