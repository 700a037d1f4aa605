"""When bulk_schedule() makes a debounced task due (scheduling.due_time()), as timeouts_debounce_v1
decides it for schedule(): the time asked for, capped at the first scheduling plus max_wait, and the
cap alone never earlier than the task was due and than now."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from timeouts.store.scheduling import NewTask, due_time

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
TASK = NewTask(biz_type="test.record", biz_id="k", at=None, delay=30 * MINUTE, attribute="{}", max_attempts=1,
               ttr=60, on_conflict="debounce")


def test_without_max_wait_the_time_asked_for():
    assert due_time(TASK, NOW, NOW - 60 * MINUTE, NOW) == NOW + 30 * MINUTE
    at = NOW - 5 * MINUTE  # a time in the past is kept: due at once
    assert due_time(replace(TASK, at=at, delay=None), NOW, NOW, NOW) == at


def test_max_wait_caps_at_the_first_scheduling_plus_max_wait():
    capped = replace(TASK, max_wait=10 * MINUTE)
    assert due_time(capped, NOW, NOW - 5 * MINUTE, NOW + MINUTE) == NOW + 5 * MINUTE
    assert due_time(capped, NOW, NOW, NOW) == NOW + 10 * MINUTE  # a new task: first scheduled now
    assert due_time(replace(TASK, max_wait=40 * MINUTE), NOW, NOW, NOW) == NOW + 30 * MINUTE


def test_a_passed_cap_keeps_an_overdue_task_at_its_cap_and_brings_a_later_one_to_now():
    capped = replace(TASK, max_wait=60 * MINUTE)
    first = NOW - 120 * MINUTE
    assert due_time(capped, NOW, first, first + MINUTE) == first + 60 * MINUTE  # it was due before its cap
    assert due_time(capped, NOW, first, NOW + 60 * MINUTE) == NOW  # it was due later: now, not an hour ago


def test_a_max_wait_too_large_to_add_is_never_added():
    assert due_time(replace(TASK, max_wait=timedelta.max), NOW, NOW, NOW) == NOW + 30 * MINUTE
