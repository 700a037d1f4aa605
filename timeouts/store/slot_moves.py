"""Moving whole slots' task rows from one shard to another (storage/resharding.py decides what
moves, and checks that it may), and keeping the job id sequences of the shards apart afterwards.

The rows are copied into the target in one transaction there, then deleted from the source in one
transaction there: a run that stops between the two leaves the rows in both, and the next copies
nothing twice (insert_moving_rows keeps a key once) and finishes the delete.
"""

from django.db import connections, transaction

from timeouts.store.queries import QUERIES, execute, fetch_one


def copy_slots(source: str, target: str, slots) -> None:
    """The rows of `slots` on `source`, into `target`'s partitions, streamed with COPY through a
    temporary table of the target's transaction."""
    params = {"slots": list(slots)}
    with transaction.atomic(using=target):
        execute("create_moving_rows", using=connections[target]).close()
        with connections[source].cursor() as reading, connections[target].cursor() as writing:
            with reading.cursor.copy(QUERIES["slot_rows"], params) as rows, \
                    writing.cursor.copy(QUERIES["copy_moving_rows"]) as copy:
                for chunk in rows:
                    copy.write(chunk)
        execute("insert_moving_rows", using=connections[target]).close()


def delete_slots(source: str, slots) -> int:
    """Delete the rows of `slots` from `source`; returns how many it held."""
    with transaction.atomic(using=source):
        with execute("delete_slot_rows", {"slots": list(slots)}, using=connections[source]) as deleted:
            return deleted.rowcount


def raise_sequences(aliases: list[str]) -> None:
    """Every shard's job id sequence past the highest value any of them has given, so that a moved
    slot's new tasks cannot take an id it brought along."""
    highest = max(fetch_one("last_sequence_value", using=connections[alias])["value"] for alias in aliases)
    for alias in aliases:
        execute("raise_sequence", {"value": highest}, using=connections[alias]).close()
