"""Creating tasks: `schedule()` one at a time, `bulk_schedule()` many in one COPY.

Input is validated completely before the first statement, so a rejected call stores nothing.
Both run in the caller's transaction when there is one: a rollback means the task never existed.
With several shards, a call inside a transaction whose task goes to a shard outside it is refused
(shards.require_transaction()).

`on_conflict` keeps at most one waiting task per (biz_type, biz_id): the key's transaction-level
advisory lock (lock_biz_key) orders the callers of one key, so each sees what the one before it
committed. bulk_schedule() takes the locks of all its keys in one statement, in one order every
caller follows (so two batches never wait for each other in a circle), reads the waiting tasks of
all of them in one statement, and settles each key in the order of the batch (_settle()): an item
meets the key's waiting task, or an earlier item of the same key, as schedule() would.

Outside a transaction (the common case) schedule() does all that in one statement, its own
transaction, with no BEGIN nor COMMIT: schedule_keyed, whose database function
timeouts_waiting_for_key_v2 takes the key's locks and reads (or, to replace them, cancels) its
waiting tasks with a snapshot taken after the locks (sql/migrations/0002_keyed_schedule.sql says
why that is race-free), and whose INSERT then adds the task.

"debounce" moves the key's PENDING task rather than adding one. schedule() takes the key's lock
and moves the task in one database function, timeouts_debounce_v1 (sql/migrations/0001_debounce.sql
says why that is race-free): one round trip, outside a transaction, for a key that has such a task,
the common case of a debounced key. A call that finds none inserts the task as the other modes
do, in one transaction with the function, which holds the lock until then.

Each lock is an entry of PostgreSQL's shared lock table, which holds some thousands in all
(max_locks_per_transaction per connection) and refuses more with "out of shared memory". So a
key's lock comes after a shared lock on its bucket, one of KEY_BUCKETS, and a batch of more than
MAX_KEY_LOCKS keys locks the buckets of its keys instead, exclusively: whatever its size, it holds
at most that many entries, and it still excludes every other caller on its keys.
"""

from collections import Counter
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import connections, transaction

from timeouts import events, tracing, validation
from timeouts.conf import get_settings, notify_params
from timeouts.errors import TaskConflict, TimeoutsError
from timeouts.registry import get_handler
from timeouts.states import WAITING, Status
from timeouts.storage import shards
from timeouts.store.queries import execute, fetch_dicts, fetch_one, fetch_values
from timeouts.store.serialization import retry_on_conflict
from timeouts.validation import DEFAULT_ON_CONFLICT

# First key of the two-key advisory locks, so our locks cannot collide with the host's one-key
# locks: one namespace for the keys, one for their buckets.
ADVISORY_LOCK_NAMESPACE = 0x74696D65  # "time"
BUCKET_LOCK_NAMESPACE = 0x74696D62  # "timb"
# A key's bucket: the low bits of its lock's hash (a power of two, so a mask).
KEY_BUCKETS = 64
# The most keys a batch locks one by one; a larger batch locks their buckets.
MAX_KEY_LOCKS = 1024


def lock_params() -> dict:
    """The advisory locks' namespaces, for lock_biz_key and lock_biz_keys."""
    return {"namespace": ADVISORY_LOCK_NAMESPACE, "bucket_namespace": BUCKET_LOCK_NAMESPACE,
            "bucket_mask": KEY_BUCKETS - 1}


def lock_key(key: dict, connection) -> None:
    """The lock of one (biz_type, biz_id), until the transaction ends."""
    execute("lock_biz_key", {**lock_params(), **key}, using=connection).close()

COPY_COLUMNS = ("biz_type", "biz_id", "action_time", "run_at", "attribute", "max_attempts", "ttr", "trace_context")


# Not frozen: one is made per task, and a frozen dataclass sets each field through
# object.__setattr__(). None is changed once made: replace() makes another.
@dataclass(slots=True)
class NewTask:
    biz_type: str
    biz_id: str
    at: object  # aware UTC datetime, or None when delay is set
    delay: timedelta | None
    attribute: str  # JSON text
    max_attempts: int
    ttr: int
    on_conflict: str | None
    max_wait: timedelta | None = None  # on_conflict="debounce" only

    def params(self, slot: int | None = None):
        """insert_task's parameters; `slot`: the task's (shards.place()), by default its biz_id's. With
        the trace context of the caller, now (tracing.py)."""
        return {
            "slot": shards.slot_of(self.biz_id) if slot is None else slot,
            "biz_type": self.biz_type,
            "biz_id": self.biz_id,
            "at": self.at,
            "delay": self.delay,
            "attribute": self.attribute,
            "max_attempts": self.max_attempts,
            "ttr": self.ttr,
            "trace_context": tracing.stored_context(),
            **notify_params(),
        }


def prepare(biz_type, biz_id, *, at=None, delay=None, attribute=None, on_conflict=DEFAULT_ON_CONFLICT,
            max_wait=None) -> NewTask:
    settings = get_settings()
    handler = get_handler(biz_type)
    at, delay = validation.action_time(at, delay)
    on_conflict = validation.on_conflict(on_conflict)
    return NewTask(
        biz_type=biz_type,
        biz_id=validation.biz_id(biz_id),
        at=at,
        delay=delay,
        attribute=validation.attribute(attribute, settings.MAX_ATTRIBUTE_BYTES),
        max_attempts=handler.max_attempts or settings.DEFAULT_MAX_ATTEMPTS,
        ttr=handler.ttr or settings.DEFAULT_TTR,
        on_conflict=on_conflict,
        max_wait=validation.max_wait(max_wait, on_conflict),
    )


def schedule(model, biz_type, biz_id, *, at=None, delay=None, attribute=None, on_conflict=DEFAULT_ON_CONFLICT,
             max_wait=None, using=None):
    """`using`: the shard, when the caller chose it; else the one the task's key belongs to."""
    new = prepare(biz_type, biz_id, at=at, delay=delay, attribute=attribute, on_conflict=on_conflict,
                  max_wait=max_wait)
    where = shards.place(new.biz_type, new.biz_id, using)
    _require_transaction([where.alias], f"the task {new.biz_type}:{new.biz_id}", chosen=using is not None)
    connection = connections[where.alias]
    if new.on_conflict is None:
        return events.scheduled(insert(model, new, where, connection), where.alias, connection=connection)
    if new.on_conflict == "debounce" and connection.get_autocommit():
        # Outside a transaction the move is one statement, its own transaction: no BEGIN, no
        # COMMIT. Only when the key has no PENDING task does the call go on below, where the key's
        # lock is held from the check to the insert.
        moved, _due = retry_on_conflict(partial(_debounce, model, new, connection), using=where.alias)
        if moved is not None:
            return moved
    # The key's waiting task may move to another partition (a reschedule) while it is read FOR
    # UPDATE (40001): the whole step runs again, lock included.
    if new.on_conflict != "debounce" and connection.get_autocommit():
        return retry_on_conflict(partial(_schedule_keyed_alone, model, new, where, connection), using=where.alias)
    task, _created = retry_on_conflict(partial(_schedule_keyed_in_transaction, model, new, where), using=where.alias)
    return task


def _schedule_keyed_alone(model, new: NewTask, where: shards.Place, connection):
    """_schedule_keyed() outside a transaction, in one statement that is its own (schedule_keyed):
    the key's lock, the look at its waiting tasks, and the insert, with no BEGIN nor COMMIT."""
    using = where.alias
    params = {**new.params(where.slot), **lock_params(), "replace": new.on_conflict == "replace"}
    job_id, action_time, attribute, created_at, _notified, waiting, first_job_id, first_action_time = fetch_values(
        "schedule_keyed", params, using=connection)
    if job_id is None:  # the key has a waiting task
        first = {"job_id": first_job_id, "action_time": first_action_time}
        if new.on_conflict == "error":
            raise _conflict(new, first)
        return model._from_row(fetch_one("task_at", first, using=connection), using)  # "keep"
    if waiting:
        events.cancelled(new.biz_type, waiting, using=using)  # "replace"
    return events.scheduled(model._inserted(
        using, job_id=job_id, biz_type=new.biz_type, biz_id=new.biz_id, action_time=action_time,
        attribute=attribute, max_attempts=new.max_attempts, ttr=new.ttr, created_at=created_at,
    ), using, connection=connection)


def _schedule_keyed_in_transaction(model, new: NewTask, where: shards.Place):
    # savepoint=False: inside the caller's transaction, retry_on_conflict() has opened the savepoint.
    with transaction.atomic(using=where.alias, savepoint=False):
        return _schedule_keyed(model, new, where)


def _schedule_keyed(model, new: NewTask, where: shards.Place):
    """At most one waiting task per (biz_type, biz_id), race-free across processes.

    Returns (task, created).
    The advisory lock is held until the surrounding transaction ends, so a concurrent caller for the
    same key waits, then sees this task. (It relies on READ COMMITTED, Django's default: each
    statement sees what committed before it started.)
    """
    using = where.alias
    connection = connections[using]
    if new.on_conflict == "debounce":
        moved, due = _debounce(model, new, connection)
        if moved is not None:
            return moved, False
        return events.scheduled(insert(model, due, where, connection), using), True
    key = {"biz_type": new.biz_type, "biz_id": new.biz_id}
    lock_key(key, connection)
    waiting = fetch_dicts("waiting_tasks_for_key", key, using=connection)
    if waiting:
        if new.on_conflict == "error":
            raise _conflict(new, waiting[0])
        if new.on_conflict == "keep":
            return model._from_row(waiting[0], using), False
        replaced = execute("cancel_by_key", {**key, "statuses": list(WAITING)}, using=connection)
        events.cancelled_rows(new.biz_type, replaced, using)
    return events.scheduled(insert(model, new, where, connection), using), True


def _debounce(model, new: NewTask, connection):
    """on_conflict="debounce", under the key's lock (which this takes): (the key's PENDING task, moved
    to the new time and attribute, None), or, when the key has none, (None, `new` at the time the
    database gave it: capped by max_wait), to insert."""
    params = {**lock_params(), "biz_type": new.biz_type, "biz_id": new.biz_id, "at": new.at, "delay": new.delay,
              "max_wait": new.max_wait, "attribute": new.attribute, **notify_params()}
    row = fetch_one("debounce_task", params, using=connection)
    if row["job_id"] is not None:
        return model._from_row(row, connection.alias), None
    if new.delay is None:
        return None, replace(new, at=row["due"])  # `at`, or sooner: the call's clock plus max_wait
    # A delay stays one, added to the insert's clock as in every mode, so the new task is due that
    # long after its creation, its first scheduling: or max_wait after it, if that is sooner.
    return None, replace(new, delay=min(new.delay, new.max_wait) if new.max_wait is not None else new.delay)


def insert(model, new: NewTask, where: shards.Place, connection):
    """INSERT one task, checked (prepare()) and placed (shards) by the caller; returns it as stored:
    the query returns what the database decided, the call gives the rest. The one insert of a task
    row, for schedule(), a stored Celery call (durable/calls.py) and an enqueued task of Django's
    tasks framework (backends/backend.py). A statement that is its own transaction notifies without
    the once-per-transaction function (insert_task_autocommit)."""
    query = "insert_task_autocommit" if connection.get_autocommit() else "insert_task"
    row = fetch_values(query, new.params(where.slot), using=connection)
    job_id, action_time, attribute, created_at, _notified = row
    return model._inserted(
        connection.alias, job_id=job_id, biz_type=new.biz_type, biz_id=new.biz_id, action_time=action_time,
        attribute=attribute, max_attempts=new.max_attempts, ttr=new.ttr, created_at=created_at,
    )


def _conflict(new: NewTask, waiting: dict, prefix: str = "") -> TaskConflict:
    return TaskConflict(f"{prefix}{new.biz_type}:{new.biz_id} already has a task waiting to run "
                        f"(job_id {waiting['job_id']}, due {waiting['action_time'].isoformat()})")


def bulk_schedule(model, items: Iterable[Mapping[str, Any]], *, using: str | None = None) -> int:
    """Schedule every item or none; returns how many tasks were created. Input is checked before
    anything is written; a conflict (on_conflict="error", with a waiting task or with an earlier
    item of the batch) stores nothing either. With several shards, each shard's tasks are written
    in a transaction of that shard, all committed together at the end: only a shard that fails at
    its own commit can leave the others' tasks stored. `using`: one shard for all, when the caller
    chose it."""
    if isinstance(items, (str, bytes, Mapping)) or not hasattr(items, "__iter__"):
        raise TimeoutsError(f"bulk_schedule() takes an iterable of dicts, got {type(items).__name__}")
    prepared = []
    for index, item in enumerate(items):
        if type(item) is not dict and not isinstance(item, Mapping):  # a dict skips the ABC's check
            raise TimeoutsError(f"item {index}: expected a dict of schedule() arguments, got {type(item).__name__}")
        try:
            prepared.append((index, prepare(**item)))
        except TypeError as exc:  # unexpected or missing keys
            raise TimeoutsError(f"item {index}: {exc}") from None
        except TimeoutsError as exc:
            raise type(exc)(f"item {index}: {exc}") from None
    if not prepared:
        return 0
    by_shard: dict[str, list[tuple[int, NewTask, shards.Place]]] = {}
    for index, new in prepared:
        where = shards.place(new.biz_type, new.biz_id, using)
        by_shard.setdefault(where.alias, []).append((index, new, where))
    _require_transaction(by_shard, f"part of bulk_schedule()'s {len(prepared)} task(s)", chosen=using is not None)
    # Shards in one order for every caller, as the keys within a shard: the locks of two batches
    # never wait for each other in a circle.
    aliases = sorted(by_shard)
    with ExitStack() as transactions:
        for alias in aliases:
            transactions.enter_context(transaction.atomic(using=alias))
        return sum(_bulk_schedule_on(model, alias, by_shard[alias]) for alias in aliases)


def _require_transaction(aliases, what, *, chosen):
    """Refused when a task would go to a shard outside the caller's transaction; `chosen`: the
    caller named the shard (TimeoutTask.objects.using())."""
    if shards.shards_in_transaction() is None:  # the common case: nothing to refuse, no message to write
        return
    router = get_settings().SHARD_ROUTER
    if chosen:
        remedy = "name the database of your transaction in TimeoutTask.objects.using()"
    elif router is None:
        remedy = "set TIMEOUTS['SHARD_ROUTER'] to a function that keeps tasks on the database of your transaction"
    else:
        remedy = f"make TIMEOUTS['SHARD_ROUTER'] ({router}) keep them on the database of your transaction"
    shards.require_transaction(aliases, what, remedy)


def _bulk_schedule_on(model, alias, placed) -> int:
    """One shard's part of bulk_schedule(), inside its transaction, in as many statements whatever
    the batch's size: the locks of its keys, their waiting tasks, the cancel of those it replaces,
    the move of those it debounces, the COPY (with its job ids and one reading of the clock) and the
    NOTIFY."""
    connection = connections[alias]
    keys = sorted({(new.biz_type, new.biz_id) for _, new, _ in placed if new.on_conflict is not None})
    waiting: dict[tuple[str, str], list[dict]] = {}
    if keys:
        params = {"biz_types": [biz_type for biz_type, _ in keys], "biz_ids": [biz_id for _, biz_id in keys]}
        execute("lock_biz_keys", {**lock_params(), **params, "by_bucket": len(keys) > MAX_KEY_LOCKS},
                using=connection).close()
        rows = retry_on_conflict(partial(fetch_dicts, "waiting_tasks_for_keys", params, using=connection), using=alias)
        for row in rows:
            waiting.setdefault((row["biz_type"], row["biz_id"]), []).append(row)
    if keys:
        rows, replaced, moved = _settle(placed, waiting)
    else:  # no item has an on_conflict: each is a task of its own
        rows, replaced, moved = [(new, where) for _, new, where in placed], [], {}
    if replaced:
        # Locked above (FOR UPDATE): still waiting, and where they were read.
        cancelled = fetch_dicts("cancel_waiting_tasks", {"job_ids": [row["job_id"] for row in replaced],
                                                         "action_times": [row["action_time"] for row in replaced]},
                                using=connection)
        for biz_type, count in Counter(row["biz_type"] for row in cancelled).items():
            events.cancelled(biz_type, count, alias)
    # One reading of the database clock for the whole batch: the base of its delays, and the first
    # scheduling of the debounced tasks it creates.
    now = None
    if any(new.delay is not None or new.max_wait is not None for new, _ in rows) or moved:
        now = fetch_one("database_now", using=connection)["now"]
    deadlines = []
    if moved:
        deadlines += _move(moved, now, connection)
    if rows:
        deadlines.append(_copy(rows, now, connection))
        events.scheduled_batch((new.biz_type for new, _ in rows), alias)
    if deadlines:
        execute("notify_deadline", {"deadline": min(deadlines), **notify_params()}, using=connection).close()
    return len(rows)


def _settle(placed, waiting: dict[tuple[str, str], list[dict]]):
    """What a batch does to its keys, item by item in its order, as schedule() calls one after the
    other would: returns the (new, where) to insert, the waiting rows that "replace" cancels and the
    PENDING rows that "debounce" moves (as {job_id: (row, the item that moves it last)}), or raises
    TaskConflict for an "error" item whose key has a waiting task, or an earlier item of the batch
    (then nothing is stored). `waiting`: the waiting tasks of the keys that an item with an
    on_conflict names. A debounced item whose key has neither a PENDING task nor an earlier item
    gives the batch a task of that key, which its next debounced items move in turn."""
    inserted: dict[int, tuple[NewTask, shards.Place]] = {}  # by the item's index, in batch order
    replaced: list[dict] = []
    moved: dict[int, tuple[dict, NewTask]] = {}
    stored = {key: list(rows) for key, rows in waiting.items()}  # still waiting, as far as the batch knows
    batched: dict[tuple[str, str], list[int]] = {}  # the items of each key that would be inserted so far
    for index, new, where in placed:
        key = (new.biz_type, new.biz_id)
        before, earlier = stored.setdefault(key, []), batched.setdefault(key, [])
        if new.on_conflict == "debounce":
            pending = [row for row in before if row["status"] == Status.PENDING]
            if pending:  # the first created, as timeouts_debounce_v1 picks it
                row = min(pending, key=lambda row: (row["created_at"], row["job_id"]))
                moved[row["job_id"]] = (row, new)
                continue
            if earlier:  # the task this batch creates for the key takes this item's time and attribute
                inserted[earlier[0]] = (new, inserted[earlier[0]][1])
                continue
        elif new.on_conflict is not None and (before or earlier):
            if new.on_conflict == "error":
                if before:
                    raise _conflict(new, before[0], prefix=f"item {index}: ")
                raise TaskConflict(f"item {index}: item {earlier[0]} of the same batch schedules "
                                   f"{new.biz_type}:{new.biz_id} already")
            if new.on_conflict == "keep":
                continue
            replaced += before  # "replace"
            for row in before:
                moved.pop(row["job_id"], None)
            before.clear()
            for item in earlier:
                del inserted[item]
            earlier.clear()
        inserted[index] = (new, where)
        earlier.append(index)
    return list(inserted.values()), replaced, moved


def due_time(new: NewTask, now: datetime, first_scheduled: datetime, was_due: datetime) -> datetime:
    """When `new` is due: its `at`, or `now` plus its delay; with max_wait, never later than
    `first_scheduled` plus max_wait (compared as timedeltas: a max_wait too large to add to a
    datetime is never added to one), and the cap alone never earlier than `was_due` (the moved
    task's action_time, or now) and `now`. What timeouts_debounce_v1 computes, for bulk_schedule()."""
    at = new.at if new.delay is None else now + new.delay
    if new.max_wait is None or at - first_scheduled <= new.max_wait:
        return at
    return min(at, max(first_scheduled + new.max_wait, min(was_due, now)))


def _move(moved: dict[int, tuple[dict, NewTask]], now, connection) -> list:
    """Move the debounced tasks, locked above (FOR UPDATE), to their new times and attributes; returns
    the new deadlines of those that moved earlier, for the batch's NOTIFY."""
    rows = [(row, new, due_time(new, now, row["created_at"], row["action_time"])) for row, new in moved.values()]
    execute("move_waiting_tasks", {"job_ids": [row["job_id"] for row, _, _ in rows],
                                   "action_times": [row["action_time"] for row, _, _ in rows],
                                   "dues": [due for _, _, due in rows],
                                   "attributes": [new.attribute for _, new, _ in rows]}, using=connection).close()
    return [due for row, _, due in rows if due < row["run_at"]]


def _copy(rows, now, connection):
    """COPY the rows in (`now`: the batch's reading of the database clock, if one of them needs it);
    returns the earliest action_time, for the one NOTIFY of the batch."""
    earliest = None
    job_ids = _job_ids(connection, [where.slot for _, where in rows])
    trace_context = tracing.stored_context()  # the caller's, the same for the whole batch
    # Without one, its column is left out of the COPY (NULL, as it would write), one less to send per row.
    columns = COPY_COLUMNS if trace_context is not None else COPY_COLUMNS[:-1]
    statement = f"COPY timeouts_task ({', '.join(('job_id', *columns))}) FROM STDIN"
    with connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
        for (new, _), job_id in zip(rows, job_ids, strict=True):
            at = new.at if new.delay is None and new.max_wait is None else due_time(new, now, now, now)
            row = (job_id, new.biz_type, new.biz_id, at, at, new.attribute, new.max_attempts, new.ttr)
            copy.write_row(row if trace_context is None else (*row, trace_context))
            if earliest is None or at < earliest:
                earliest = at
    return earliest


def _job_ids(connection, slots) -> list[int]:
    """The job_ids of new tasks in these slots, as insert_task makes them (shards.py)."""
    values = fetch_one("next_job_ids", {"count": len(slots)}, using=connection)["values"]
    return [value * shards.SLOTS + slot for value, slot in zip(values, slots, strict=True)]
