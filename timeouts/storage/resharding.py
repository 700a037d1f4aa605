"""Moving whole slots to the shards that hold them after TIMEOUTS["SHARDS"] changed
(`manage.py timeouts_reshard`; docs: howto/shards).

A slot's owner follows from the list of shards alone (shards.shard_index), so comparing the old
list with the new one tells which slots move, from where to where. Each move copies the slots'
rows into the new owner, in one transaction there, and then deletes them from the old owner: a run
that stops between the two leaves the rows in both, and the next run copies nothing twice (the same
key is kept once) and finishes the delete. The sequences are then raised past every job_id any
shard has given, so that a moved slot's new tasks cannot take an id it brought along.

It needs every process stopped (dispatchers, beat, workers, whatever schedules): a task in flight
would be run by its old shard's workers while its copy waits on the new one. It refuses to move a
slot that has a task DISPATCHED or RUNNING, and to move anything while SHARD_ROUTER is set.
"""

from collections import defaultdict
from dataclasses import dataclass

from django.db import connections

from timeouts.conf import get_settings
from timeouts.errors import TimeoutsError
from timeouts.storage.shards import SLOTS, shard_index
from timeouts.store import slot_moves
from timeouts.store.queries import execute, fetch_dicts, fetch_one


class ReshardError(TimeoutsError):
    """A move that cannot be made safely; nothing was moved."""


@dataclass(frozen=True)
class Move:
    source: str
    target: str
    slots: tuple[int, ...]

    def __str__(self):
        return f"{len(self.slots)} slot(s) {self.slots[0]}-{self.slots[-1]} from {self.source} to {self.target}"


def moves(old: list[str], new: list[str]) -> list[Move]:
    """The slots whose owner differs between the two lists of shards, grouped by (from, to)."""
    moving = defaultdict(list)
    for slot in range(SLOTS):
        source, target = old[shard_index(slot, len(old))], new[shard_index(slot, len(new))]
        if source != target:
            moving[source, target].append(slot)
    return [Move(source, target, tuple(slots)) for (source, target), slots in moving.items()]


def check_router():
    """Slots move to the shard their position gives them; a routed key's tasks live where the
    router says, which no slot tells. Moved, they would sit on a database the router does not name,
    where cancel by key and on_conflict (which ask the router) no longer find them."""
    router = get_settings().SHARD_ROUTER
    if router is not None:
        raise ReshardError(
            f"TIMEOUTS['SHARD_ROUTER'] is set ({router}): slots move by their position in SHARDS, but your router, "
            "not the slot, says where a key's tasks live, so routed tasks would be moved away from the database "
            "it names, where cancelling them by key and on_conflict would no longer find them. Nothing was moved. "
            "To add a shard with a router: stop whatever schedules, let every waiting task run (or cancel it), "
            "then add the shard at the end of SHARDS and deploy (docs: howto/shards).")


def check(move: Move):
    in_flight = fetch_one("slot_rows_in_flight", {"slots": list(move.slots)}, using=connections[move.source])["rows"]
    if in_flight:
        raise ReshardError(f"{move}: {in_flight} task(s) are DISPATCHED or RUNNING; stop every dispatcher, beat "
                           "and worker, let the leases run out, and run it again")


def apply(move: Move) -> int:
    """Copy the slots' rows into the target, then delete them from the source; returns how many
    the source held."""
    slot_moves.copy_slots(move.source, move.target, move.slots)
    return slot_moves.delete_slots(move.source, move.slots)


def raise_sequences(aliases: list[str]):
    """Every shard's job id sequence past the highest value any of them has given."""
    slot_moves.raise_sequences(aliases)


def copy_limits(source: str, targets: list[str]) -> None:
    """The limits and pauses of `source` into shards that lack them (a new shard has none)."""
    rows = fetch_dicts("limits_rows", using=connections[source])
    for alias in targets:
        for row in rows:
            execute("insert_limits_row", row, using=connections[alias]).close()


def clear_limit_shares(aliases: list[str]) -> None:
    """Every shard back to even parts of the limits: the parts were shared among the old shards
    (limit_shares.py), and the next scan shares them among the new ones."""
    for alias in aliases:
        execute("clear_limit_shares", using=connections[alias]).close()
