"""Where a task lives when timeouts' tables are on several databases (TIMEOUTS["SHARDS"]).

A task's biz_id picks one of SLOTS logical slots by a stable hash, and the slots are shared out
among the shards in contiguous runs (the first alias holds the first SLOTS / n slots, and so on).
Adding a shard later moves whole slots, never single tasks (docs: howto/shards). SHARD_ROUTER, a
dotted path to `f(biz_type, biz_id) -> alias`, replaces the hash's choice of shard, for example to
keep a task on the database of the order it belongs to, inside the order's transaction; the slot
is then one of that shard's, still picked by the hash.

A task's job_id is `sequence value * SLOTS + slot`: unique across shards (each slot is on one
shard at a time), and enough to find the task's shard without asking any other. Everything about
one business object (schedule, `on_conflict`, cancel by key) goes to the shard of its (biz_type,
biz_id). With one shard, the default, nothing else changes: the slot only shapes the job_id, so
that a deployment can grow to more shards later.

Inside the caller's transaction (an atomic block on `default` or on a shard), a task is stored only
on a shard that is itself inside an atomic block on this thread (require_transaction()): written on
another, it would commit at once, and a rolled-back order would still get its timeout. A key's
shard is fixed, so such a call is refused; rows without a business key go to a shard the
transaction holds (anywhere()). A host's other databases are not timeouts' business: their
transactions do not count.
"""

import hashlib
import random
from functools import cache
from typing import NamedTuple

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils.module_loading import import_string

from timeouts.conf import get_settings
from timeouts.errors import ShardOutsideTransaction

# A power of two: the slot is the low bits of the hash and of the job_id (SQL: job_id & 1023).
SLOTS = 1024


# A tuple: made once per task, which a frozen dataclass would make slower (bulk_schedule()).
class Place(NamedTuple):
    alias: str  # the Django database alias of the shard
    slot: int


def slot_of(biz_id: str) -> int:
    """The slot of a biz_id: the low bits of the first four bytes of its MD5, which PostgreSQL
    computes alike: `('x' || left(md5(biz_id), 8))::bit(32)::int & 1023`."""
    digest = hashlib.md5(biz_id.encode(), usedforsecurity=False).digest()
    return (digest[2] << 8 | digest[3]) & (SLOTS - 1)  # SLOTS - 1 < 2**16: the low two bytes of the four


def aliases() -> tuple[str, ...]:
    return tuple(get_settings().SHARDS)


def position(alias: str) -> dict:
    """Which of how many shards `alias` is, as the claim's parameters: it takes this shard's part of
    each limit (limit_shares.py). A database that is not one of the shards counts as the only one."""
    shards = aliases()
    if alias not in shards:
        return {"shard_index": 0, "shard_count": 1}
    return {"shard_index": shards.index(alias), "shard_count": len(shards)}


def shard_index(slot: int, count: int) -> int:
    """Which of `count` shards holds `slot`: the first holds the first SLOTS / count slots, and so on."""
    return slot * count // SLOTS


def slot_range(index: int, count: int) -> range:
    """The slots of the `index`th of `count` shards (the slots shard_index() gives it)."""
    return range(-(-index * SLOTS // count), -(-(index + 1) * SLOTS // count))


def alias_of_slot(slot: int) -> str:
    shards = aliases()
    return shards[shard_index(slot, len(shards))]


def slots_of(alias: str) -> range:
    shards = aliases()
    return slot_range(shards.index(alias), len(shards))


def alias_of_job(job_id: int) -> str:
    return alias_of_slot(job_id & (SLOTS - 1))


def place(biz_type: str, biz_id: str, alias: str | None = None) -> Place:
    """The shard and slot of a new task of (biz_type, biz_id): on `alias` if given (a caller that
    chose its database), else where SHARD_ROUTER or the hash puts it."""
    slot = slot_of(biz_id)
    shards = aliases()
    if alias is None:
        router = _router()
        if router is None:
            return Place(shards[0] if len(shards) == 1 else alias_of_slot(slot), slot)
        alias = router(biz_type, biz_id)
    if len(shards) == 1:
        return Place(alias, slot)
    if alias not in shards:
        raise ImproperlyConfigured(
            f"timeouts: {biz_type}:{biz_id} was routed to {alias!r}, which is not in TIMEOUTS['SHARDS']")
    own = slots_of(alias)
    return Place(alias, own[slot % len(own)])


def alias_of_key(biz_type: str, biz_id: str) -> str:
    return place(biz_type, biz_id).alias


def hashed(key: str) -> Place:
    """Where the hash alone puts `key`, whatever SHARD_ROUTER says: for rows whose key is not a
    business object of the host's (a Celery call's task_id, a Django task's result)."""
    slot = slot_of(key)
    return Place(alias_of_slot(slot), slot)


def _router():
    path = get_settings().SHARD_ROUTER
    return None if path is None else _imported(path)


@cache
def _imported(path):
    return import_string(path)


def anywhere(what: str) -> Place:
    """A slot picked at random, for rows that no business key looks up (a Django task: its result
    id holds its job_id, and so its slot); inside the caller's transaction, one of a shard that the
    transaction holds, so that the row is part of it. `what`: the row, for the error."""
    held = shards_in_transaction()
    if held is None:
        slot = random.randrange(SLOTS)
        return Place(alias_of_slot(slot), slot)
    if not held:
        raise ShardOutsideTransaction(_refusal(what, aliases(), any_of=True))
    slot = random.choice([slot for alias in held for slot in slots_of(alias)])
    return Place(alias_of_slot(slot), slot)


def shards_in_transaction() -> list[str] | None:
    """The shards inside an atomic block on this thread, when the caller is in a transaction that
    counts (on `default` or on a shard); None when it is in none, or with the one shard "default"
    (every task then goes to the database of the caller's transaction, if it has one)."""
    shards = aliases()
    if shards == (DEFAULT_DB_ALIAS,) or not _databases_in_transaction():
        return None
    return [alias for alias in shards if connections[alias].in_atomic_block]


def require_transaction(targets, what: str, remedy: str) -> None:
    """Refuse, before anything is stored, to store `what` on the shards `targets` when the caller is
    in a transaction that counts and some of them are not inside an atomic block on this thread.
    `remedy`: the way out that belongs to the caller's entry point, said before the common ones."""
    held = shards_in_transaction()
    if held is None:
        return
    outside = [alias for alias in dict.fromkeys(targets) if alias not in held]
    if outside:
        raise ShardOutsideTransaction(_refusal(what, outside, remedy=remedy))


def _databases_in_transaction() -> list[str]:
    """Of `default` and the shards, those inside an atomic block on this thread."""
    counted = dict.fromkeys((DEFAULT_DB_ALIAS, *aliases()))
    return [alias for alias in counted if alias in connections and connections[alias].in_atomic_block]


def _refusal(what, outside, *, remedy=None, any_of=False) -> str:
    held = _databases_in_transaction()
    if any_of:
        where = f"one of the shards {_names(outside)}, none of which is"
        atomic = "transaction.atomic(using=<one of them>)"
    else:
        where = (f"the shard {outside[0]!r}, which is" if len(outside) == 1
                 else f"the shards {_names(outside)}, which are")
        atomic = " and ".join(f"transaction.atomic(using={alias!r})" for alias in outside)
    ways = [remedy] if remedy else []
    ways += [f"open {atomic} around the call as well, accepting that the databases then commit one after "
             "the other, not as one", "store it after your commit, in transaction.on_commit()"]
    return (f"{what} goes to {where} not in a transaction on this thread, while {_names(held)} "
            f"{'is' if len(held) == 1 else 'are'}: stored now, it would commit at once, whatever becomes of your "
            f"transaction. Nothing was stored. Either {'; or '.join(ways)}.")


def _names(aliases) -> str:
    return ", ".join(repr(alias) for alias in aliases)
