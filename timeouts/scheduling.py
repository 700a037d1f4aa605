"""Creating tasks: `schedule()` one at a time, `bulk_schedule()` many in one COPY.

Input is validated completely before the first statement, so a rejected call stores nothing.
Both run in the caller's transaction when there is one: a rollback means the task never existed.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.db import connections, transaction

from . import events, validation
from .conf import get_settings, notify_params
from .errors import TaskConflict, TimeoutsError
from .queries import execute, fetch_dicts, fetch_one, fetch_values
from .registry import get_handler
from .states import WAITING

# First key of the two-key advisory lock, so our locks cannot collide with the host's one-key locks.
ADVISORY_LOCK_NAMESPACE = 0x74696D65  # "time"

COPY_COLUMNS = ("biz_type", "biz_id", "action_time", "run_at", "attribute", "max_attempts", "ttr")


@dataclass(frozen=True)
class NewTask:
    biz_type: str
    biz_id: str
    at: object  # aware UTC datetime, or None when delay is set
    delay: timedelta | None
    attribute: str  # JSON text
    max_attempts: int
    ttr: int
    on_conflict: str | None

    def params(self):
        return {
            "biz_type": self.biz_type,
            "biz_id": self.biz_id,
            "at": self.at,
            "delay": self.delay,
            "attribute": self.attribute,
            "max_attempts": self.max_attempts,
            "ttr": self.ttr,
            **notify_params(),
        }


def prepare(biz_type, biz_id, *, at=None, delay=None, attribute=None, on_conflict=None) -> NewTask:
    settings = get_settings()
    handler = get_handler(biz_type)
    at, delay = validation.action_time(at, delay)
    return NewTask(
        biz_type=biz_type,
        biz_id=validation.biz_id(biz_id),
        at=at,
        delay=delay,
        attribute=validation.attribute(attribute, settings.MAX_ATTRIBUTE_BYTES),
        max_attempts=handler.max_attempts or settings.DEFAULT_MAX_ATTEMPTS,
        ttr=handler.ttr or settings.DEFAULT_TTR,
        on_conflict=validation.on_conflict(on_conflict),
    )


def schedule(model, biz_type, biz_id, *, at=None, delay=None, attribute=None, on_conflict=None, using="default"):
    new = prepare(biz_type, biz_id, at=at, delay=delay, attribute=attribute, on_conflict=on_conflict)
    if new.on_conflict is None:
        return events.scheduled(_insert(model, new, connections[using]), using)
    with transaction.atomic(using=using):
        task, _created = _schedule_keyed(model, new, using)
    return task


def _schedule_keyed(model, new: NewTask, using):
    """At most one waiting task per (biz_type, biz_id), race-free across processes.

    Returns (task, created).
    The advisory lock is held until the surrounding transaction ends, so a concurrent caller for the
    same key waits, then sees this task. (It relies on READ COMMITTED, Django's default: each
    statement sees what committed before it started.)
    """
    connection = connections[using]
    key = {"biz_type": new.biz_type, "biz_id": new.biz_id}
    execute("lock_biz_key", {"namespace": ADVISORY_LOCK_NAMESPACE, **key}, using=connection).close()
    waiting = fetch_dicts("waiting_tasks_for_key", key, using=connection)
    if waiting:
        if new.on_conflict == "error":
            first = waiting[0]
            raise TaskConflict(
                f"{new.biz_type}:{new.biz_id} already has a task waiting to run "
                f"(job_id {first['job_id']}, due {first['action_time'].isoformat()})"
            )
        if new.on_conflict == "keep":
            return model._from_row(waiting[0], using), False
        replaced = execute("cancel_by_key", {**key, "statuses": list(WAITING)}, using=connection)
        events.cancelled_rows(new.biz_type, replaced, using)
    return events.scheduled(_insert(model, new, connection), using), True


def _insert(model, new: NewTask, connection):
    """INSERT one task; returns it as stored: the query returns what the database decided, the call
    gives the rest. A statement that is its own transaction notifies without the once-per-transaction
    function (insert_task_autocommit)."""
    query = "insert_task_autocommit" if connection.get_autocommit() else "insert_task"
    job_id, action_time, attribute, created_at, _notified = fetch_values(query, new.params(), using=connection)
    return model._inserted(
        connection.alias, job_id=job_id, biz_type=new.biz_type, biz_id=new.biz_id, action_time=action_time,
        attribute=attribute, max_attempts=new.max_attempts, ttr=new.ttr, created_at=created_at,
    )


def bulk_schedule(model, items, *, using="default") -> int:
    """Schedule every item or none; returns how many tasks were created."""
    if isinstance(items, (str, bytes, dict)) or not hasattr(items, "__iter__"):
        raise TimeoutsError(f"bulk_schedule() takes an iterable of dicts, got {type(items).__name__}")
    prepared = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise TimeoutsError(f"item {index}: expected a dict of schedule() arguments, got {type(item).__name__}")
        try:
            prepared.append(prepare(**item))
        except TypeError as exc:  # unexpected or missing keys
            raise TimeoutsError(f"item {index}: {exc}") from None
        except TimeoutsError as exc:
            raise type(exc)(f"item {index}: {exc}") from None
    if not prepared:
        return 0
    plain = [new for new in prepared if new.on_conflict is None]
    keyed = [new for new in prepared if new.on_conflict is not None]
    created = 0
    with transaction.atomic(using=using):
        if plain:
            earliest = _copy(plain, connections[using])
            execute("notify_deadline", {"deadline": earliest, **notify_params()}, using=connections[using]).close()
            created += len(plain)
            events.scheduled_batch((new.biz_type for new in plain), using)
        for new in keyed:
            _task, was_created = _schedule_keyed(model, new, using)
            created += was_created
    return created


def _copy(rows, connection):
    """COPY the rows in; returns the earliest action_time, for the one NOTIFY of the batch."""
    now = earliest = None
    if any(new.delay is not None for new in rows):
        # One reading of the database clock for the whole batch.
        now = fetch_one("database_now", using=connection)["now"]
    statement = f"COPY timeouts_task ({', '.join(COPY_COLUMNS)}) FROM STDIN"
    with connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
        for new in rows:
            at = new.at if new.delay is None else now + new.delay
            copy.write_row((new.biz_type, new.biz_id, at, at, new.attribute, new.max_attempts, new.ttr))
            earliest = at if earliest is None else min(earliest, at)
    return earliest
