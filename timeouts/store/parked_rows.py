"""The rows parked in the DEFAULT partition (written while no partition covered their action_time),
moved into the partition made for their range: a step of the transaction that creates and attaches
it (storage/partition_ddl.py), which owns everything else of that DDL."""

from timeouts.store.queries import execute


def move_into(partition: str, lower, upper, *, using) -> int:
    """Move the rows of [lower, upper) out of DEFAULT into `partition`, a table of timeouts' own
    partition names not attached yet, on the Django connection `using`; returns how many moved."""
    with execute("move_parked_rows", {"lower": lower, "upper": upper}, using=using, partition=partition) as moved:
        return moved.rowcount
