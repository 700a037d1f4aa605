"""The states of a task, defined once.

`Status` is `TimeoutTask.Status`; the numbers are stored in the table and are public, so they never
change. The SQL files name the states as psql-style variables (`status = :PENDING`), which
`substitute()` replaces with these numbers when a file is read: the runtime queries
(queries.py) and the migrations' SQL files (migrations/__init__.py) alike.
"""

import re

from django.db import models


class Status(models.IntegerChoices):
    PENDING = 0, "pending"
    DISPATCHED = 1, "dispatched"
    DONE = 2, "done"
    CANCELLED = 3, "cancelled"
    RUNNING = 4, "running"
    DEAD = 5, "dead"


# Not started yet: a cancel still wins against the worker's compare-and-set.
WAITING = (Status.PENDING, Status.DISPATCHED)
# What a user's cancel() may end: not started, or dead (discarded).
CANCELLABLE = (Status.PENDING, Status.DISPATCHED, Status.DEAD)
# What requeue() brings back.
REQUEUEABLE = (Status.CANCELLED, Status.DEAD)
# What keeps a partition from being dropped: tasks that may still run, or wait for an operator.
UNFINISHED = (Status.PENDING, Status.DISPATCHED, Status.RUNNING, Status.DEAD)

# `:NAME` in SQL, uppercase; never the second colon of a `::cast`, nor a colon inside a word.
PLACEHOLDER = re.compile(r"(?<![:\w]):([A-Z][A-Z0-9_]*)\b")


def substitute(sql: str) -> str:
    """`sql` with every `:NAME` of a state replaced by its number; an unknown name is an error."""

    def number(match):
        try:
            return str(Status[match.group(1)].value)
        except KeyError:
            raise ValueError(f"unknown task state {match.group(0)!r} in SQL; known: "
                             f"{', '.join(':' + name for name in Status.names)}") from None

    return PLACEHOLDER.sub(number, sql)
