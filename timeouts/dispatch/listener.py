"""The dispatcher's LISTEN connection: connect, listen, wait for notifications, bounded queries.

It is a psycopg connection of its own, in autocommit, because PostgreSQL delivers notifications only
to sessions that are outside a transaction, and Django's connection may be inside one. Django's
connection stays in charge of claiming and publishing.

The same connection reads the nearest deadline. That read doubles as the keepalive: a connection can
die silently (a half-open TCP connection after a network fault or a host crash), and a session that
only waits for notifications would then wait forever. So every read has a client-side deadline, and
the socket has TCP keepalives and a TCP user timeout on top.
"""

import logging
import os
import random
import socket
import threading

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from psycopg import sql

from timeouts.store.queries import fetch_one

logger = logging.getLogger("timeouts.dispatcher")

APPLICATION_NAME = "timeouts-dispatcher"  # how operators (and tests) find these sessions


class ListenerLost(psycopg.OperationalError):
    """The LISTEN connection is gone or stopped answering: reconnect, then re-read the deadline."""


def connection_params(alias=DEFAULT_DB_ALIAS, *, query_timeout=5.0, **overrides) -> dict:
    """Django's parameters for `alias`, plus what a long-lived listening session needs."""
    params = connections[alias].get_connection_params()
    params.pop("cursor_factory", None)  # Django's cursor classes need Django's connection wrapper
    params.pop("context", None)
    timeout_ms = int(query_timeout * 1000)
    params.update(
        application_name=APPLICATION_NAME,
        connect_timeout=max(2, round(query_timeout)),  # libpq's minimum is 2 s
        # The kernel notices a dead peer after ~25 s of silence even while we only wait...
        keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3,
        # ...and gives up on a query whose bytes the peer never acknowledges.
        tcp_user_timeout=timeout_ms,
        # A read that cannot finish in time is cancelled by the server too, not left running.
        options=f"{params.get('options', '')} -c statement_timeout={timeout_ms}".strip(),
    )
    params.update(overrides)
    return params


class Listener:
    def __init__(self, channel: str, params: dict, *, query_timeout: float = 5.0):
        self.channel = channel
        self.params = params
        self.query_timeout = query_timeout
        self.conn: psycopg.Connection | None = None

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self.conn.closed

    @property
    def backend_pid(self) -> int | None:
        return self.conn.info.backend_pid if self.connected else None

    def connect(self):
        """Connect and LISTEN. Anything committed after this returns is notified to us."""
        self.close()
        conn = psycopg.connect(**self.params, autocommit=True)
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except BaseException:
            conn.close()
            raise
        self.conn = conn

    def close(self):
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:  # closing a broken connection: nothing left to save
                pass

    def query(self, name: str, params=None) -> dict | None:
        """Run a named query, giving up after `query_timeout` seconds with ListenerLost."""
        conn = self._require()
        with _Watchdog(conn, self.query_timeout):
            try:
                return fetch_one(name, params or {}, using=conn)
            except psycopg.OperationalError as exc:
                raise ListenerLost(f"query {name} failed: {exc}") from exc

    def wait(self, timeout: float) -> list[str]:
        """Sleep on the socket until a notification arrives or `timeout` seconds pass; return the
        payloads received (notifications that arrived during a query are returned at once)."""
        conn = self._require()
        try:
            return [n.payload for n in conn.notifies(timeout=max(timeout, 0.0), stop_after=1)]
        except psycopg.OperationalError as exc:
            raise ListenerLost(f"waiting for notifications failed: {exc}") from exc

    def _require(self) -> psycopg.Connection:
        if not self.connected:
            raise ListenerLost("not connected")
        return self.conn


class _Watchdog:
    """Cuts the connection's socket if the block it guards outlives `timeout`.

    A synchronous psycopg call cannot be given a deadline, and a server that went silent never
    answers. Shutting the socket down (the descriptor stays open and owned by libpq) makes the
    pending read fail at once, so the caller sees an ordinary connection error and reconnects.
    """

    def __init__(self, conn, timeout):
        self.conn = conn
        self.timeout = timeout
        self.lock = threading.Lock()
        self.finished = False
        self.fired = False
        self.timer = threading.Timer(timeout, self._fire)
        self.timer.daemon = True

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc_info):
        with self.lock:
            self.finished = True
        self.timer.cancel()
        if self.fired and exc_info[0] is not None and not isinstance(exc_info[1], ListenerLost):
            raise ListenerLost(f"no answer within {self.timeout} s") from exc_info[1]

    def _fire(self):
        with self.lock:  # never after the guarded call returned: the descriptor may be reused
            if self.finished:
                return
            self.fired = True
            logger.warning("timeouts.dispatcher: the database did not answer within %s s; dropping the connection",
                           self.timeout)
            try:
                with socket.socket(fileno=os.dup(self.conn.pgconn.socket)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except (OSError, psycopg.Error):
                pass  # already closed: the call fails by itself


class Backoff:
    """Exponential, capped, with full jitter: many dispatchers that lost the same database do not
    all come back in the same instant."""

    def __init__(self, first=0.05, cap=5.0):
        self.first = first
        self.cap = cap
        self.failures = 0

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.first * 2**self.failures)
        if ceiling < self.cap:  # counting on past the cap would overflow the float after ~1,000 failures
            self.failures += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self):
        self.failures = 0
