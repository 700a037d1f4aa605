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
"""

import hashlib
import random
from dataclasses import dataclass
from functools import cache

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .conf import get_settings

# A power of two: the slot is the low bits of the hash and of the job_id (SQL: job_id & 1023).
SLOTS = 1024


@dataclass(frozen=True)
class Place:
    alias: str  # the Django database alias of the shard
    slot: int


def slot_of(biz_id: str) -> int:
    """The slot of a biz_id: the low bits of the first four bytes of its MD5, which PostgreSQL
    computes alike: `('x' || left(md5(biz_id), 8))::bit(32)::int & 1023`."""
    digest = hashlib.md5(biz_id.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big") & (SLOTS - 1)


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
    if alias is None:
        router = _router()
        if router is None:
            return Place(alias_of_slot(slot), slot)
        alias = router(biz_type, biz_id)
    if len(aliases()) == 1:
        return Place(alias, slot)
    if alias not in aliases():
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


def anywhere() -> Place:
    """A slot picked at random, for rows that no business key looks up (a Django task: its result
    id holds its job_id, and so its slot)."""
    slot = random.randrange(SLOTS)
    return Place(alias_of_slot(slot), slot)
