"""The database connection that a Celery worker runs timeouts' own statements on.

Celery closes Django's connections before and after every task unless `CELERY_DB_REUSE_MAX` is
set, and Django's default `CONN_MAX_AGE = 0` lets none live longer. With those defaults every
`timeouts.run` message would open a new PostgreSQL session (connect, authenticate, a new server
process, Django's set-up queries) before its compare-and-set: several milliseconds on a task that
should start within one. So a worker runs timeouts' statements (a task's start, its outcome, a
batch's hand-back) on a connection of timeouts' own, one per worker thread, kept open across
messages. The handler still sees Django's connection with the host's semantics: its ORM queries
open, reuse and close connections exactly as the host configured.

That connection is a Django connection (`DatabaseWrapper`) built from the same `DATABASES` entry,
so error translation, `connection_created` receivers, the time zone and query logging behave as on
Django's own. Two options differ:

- `prepare_threshold`: psycopg's default (prepare a statement after five runs) unless the entry's
  OPTIONS name a value, `None` included. The hot queries then skip PostgreSQL's parse and, for the
  claim, its planning (docs: explanation/benchmarks). Behind a pooler that cannot keep prepared
  statements (PgBouncer in transaction mode before 1.21) set `"prepare_threshold": None` in OPTIONS.
- `pool`: never. One long-lived connection per thread needs no pool, and a pool's connections are
  made with the pool's own options.

A broken connection is replaced by the statement that finds it broken (store/attempts.py tries once more
on a new one), so no health check is paid before each message. Eager tasks (`task_always_eager`)
and tasks called as functions run inside the caller's process, maybe inside its transaction: they
keep Django's connection.
"""

import copy
import os
import threading
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, connections

# psycopg's own default: a statement is prepared once it has run this many times on a connection.
PSYCOPG_PREPARE_THRESHOLD = 5

_local = threading.local()
# The attribute that marks a connection as timeouts' own (is_own).
OWN = "timeouts_own"


def current():
    """The connection timeouts' statements use in this thread now: its own inside `used()`, else
    Django's for the first shard."""
    return getattr(_local, "active", None) or connections[DEFAULT_DB_ALIAS]


def is_own(db) -> bool:
    """Whether `db` is one of timeouts' own connections (a worker's), not Django's, which the
    caller's process uses (an eager task, timeouts.testing.run_due)."""
    return getattr(db, OWN, False)


def for_shard(alias):
    """The connection for timeouts' statements about a row of the shard `alias` in this thread: the
    current one if it is to that shard, else Django's own to it. A claim names its shard, and its
    statements go there from whichever thread runs them: the dispatcher publishes from a thread
    of its own, whose current connection is the first shard's."""
    active = getattr(_local, "active", None)
    return active if active is not None and active.alias == alias else connections[alias]


@contextmanager
def used(alias=DEFAULT_DB_ALIAS):
    """Run the block's timeouts statements on this thread's own connection to `alias` (a shard)."""
    active = getattr(_local, "active", None)
    if active is not None and active.alias == alias:
        yield
        return
    _local.active = _connection(alias)
    try:
        yield
    finally:
        _local.active = active


@contextmanager
def shared(alias):
    """Run the block's timeouts statements on Django's own connection to `alias`, which the host's
    code in this thread shares (the beat tasks: Django's connection handling applies)."""
    active = getattr(_local, "active", None)
    _local.active = connections[alias]
    try:
        yield
    finally:
        _local.active = active


def _connection(alias):
    """This thread's own connection to `alias`, made at first use. A child forked from a process
    that had some makes its own: the sockets are the parent's, so the copies are dropped without a
    word to the server (closing them would end the parent's sessions)."""
    kept = getattr(_local, "kept", None)
    if kept is None or kept[0] != os.getpid():
        kept = _local.kept = (os.getpid(), {})
    wrapper = kept[1].get(alias)
    if wrapper is None:
        django_connection = connections[alias]
        settings_dict = copy.deepcopy(django_connection.settings_dict)
        options = settings_dict.setdefault("OPTIONS", {})
        options.setdefault("prepare_threshold", PSYCOPG_PREPARE_THRESHOLD)
        options.pop("pool", None)
        wrapper = kept[1][alias] = type(django_connection)(settings_dict, alias)
        setattr(wrapper, OWN, True)
    return wrapper


def close():
    """Close this thread's own connections, if it has any (tests; a worker process just exits)."""
    kept = getattr(_local, "kept", None)
    _local.kept = None
    if kept is not None and kept[0] == os.getpid():
        for wrapper in kept[1].values():
            wrapper.close()
