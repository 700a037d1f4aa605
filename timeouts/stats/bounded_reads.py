"""Reading every shard without ever hanging on one: the health check's connections.

A database that is down refuses a connection at once, but one behind a dead network link, or a
server that stopped answering, can keep a connection attempt or a query waiting for minutes
(without `connect_timeout`, libpq waits as long as TCP does). A probe must answer in seconds
whatever the shards do, so `read_each()` reads each shard:

- in a thread of its own, every shard at once, and waits for them `timeout` seconds in all: a
  shard that has not answered by then is reported as such, and its thread is left to end by itself
  (a daemon thread: it never keeps the process from exiting);
- on a connection of its own, made from the alias's `DATABASES` entry with a `connect_timeout` and
  a `statement_timeout` of the same bound, so that thread ends soon too. Django keeps connections
  per thread: that thread finds it at `connections[alias]`, so the usual code (timeouts.stats,
  which takes an alias) reads through it, and nothing outside the thread sees it. It is closed
  when the thread ends.
"""

import copy
import math
import threading
import time
from dataclasses import dataclass

from django.db import DatabaseError, connections

# libpq rounds connect_timeout to whole seconds and takes anything below 2 as 2.
LIBPQ_SHORTEST_CONNECT_TIMEOUT = 2


@dataclass(frozen=True)
class Unreadable:
    """What became of a shard that could not be read: why, in one line."""

    error: str


def read_each(aliases, read, *, timeout: float) -> dict:
    """`read(alias)` for every alias, all at once, each on a connection that gives up after
    `timeout` seconds: by alias, what it returned, or Unreadable when it raised a database error or
    had not returned within `timeout` seconds of the call. Any other exception is raised here."""
    answers = _Answers()
    threads = []
    for alias in dict.fromkeys(aliases):
        connection = connections[alias]
        bounded = (type(connection), bounded_settings(connection.settings_dict, timeout))
        thread = threading.Thread(target=_read, args=(alias, bounded, read, answers),
                                  name=f"timeouts-health-{alias}", daemon=True)
        thread.start()
        threads.append((alias, thread))
    deadline = time.monotonic() + timeout
    for _, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    answered = answers.close()
    for outcome in answered.values():
        if isinstance(outcome, Exception):
            raise outcome
    return {alias: answered.get(alias, Unreadable(f"no answer within {timeout:g} s")) for alias, _ in threads}


class _Answers:
    """What the threads returned, by alias, until read_each() stops waiting: a later answer is dropped."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_alias = {}
        self._closed = False

    def give(self, alias, outcome):
        with self._lock:
            if not self._closed:
                self._by_alias[alias] = outcome

    def close(self) -> dict:
        with self._lock:
            self._closed = True
            return dict(self._by_alias)


def bounded_settings(settings_dict: dict, timeout: float) -> dict:
    """A copy of a `DATABASES` entry whose connection gives up connecting, and each statement, after
    `timeout` seconds (a host's shorter connect_timeout is kept), and is not pooled: a pool's
    connections are made with the pool's own options."""
    bounded = copy.deepcopy(settings_dict)
    options = bounded.setdefault("OPTIONS", {})
    options.pop("pool", None)
    wanted = max(LIBPQ_SHORTEST_CONNECT_TIMEOUT, math.ceil(timeout))
    options["connect_timeout"] = min(int(options.get("connect_timeout") or wanted), wanted)
    statement_timeout = max(1, round(timeout * 1000))
    options["options"] = f"{options.get('options', '')} -c statement_timeout={statement_timeout}".strip()
    bounded["CONN_MAX_AGE"] = 0
    bounded["CONN_HEALTH_CHECKS"] = False
    return bounded


def _read(alias, bounded, read, answers):
    wrapper_class, settings_dict = bounded
    connections[alias] = wrapper = wrapper_class(settings_dict, alias)
    try:
        outcome = read(alias)
    except DatabaseError as exc:
        outcome = Unreadable(_first_line(exc))
    except Exception as exc:  # a fault of the code, not of the shard: raised by read_each()
        outcome = exc
    finally:
        try:
            wrapper.close()
        except DatabaseError:
            pass  # a connection that broke: nothing left to close
        del connections[alias]
    answers.give(alias, outcome)


def _first_line(exc) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
