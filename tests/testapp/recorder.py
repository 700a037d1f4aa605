"""The oracle's side of a handler run: one row per start in `timeouts_test_start`, written on a
connection of its own so it survives whatever the handler's own transaction does."""

import psycopg
from django.db import connection

TABLE_SQL = """
CREATE TABLE IF NOT EXISTS timeouts_test_start (
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    action_time timestamptz NOT NULL,
    started_at timestamptz NOT NULL,  -- the worker's compare-and-set time (database clock)
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    pid integer NOT NULL DEFAULT pg_backend_pid()
)
"""

_conn = None


def _connection():
    global _conn
    if _conn is None or _conn.closed or _conn.broken:
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        _conn = psycopg.connect(**params, autocommit=True)
    return _conn


def record(task):
    _connection().execute(
        "INSERT INTO timeouts_test_start (job_id, attempt, action_time, started_at) VALUES (%s, %s, %s, %s)",
        (task.job_id, task.attempts, task.action_time, task.started_at),
    )


CONNECTIONS_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS timeouts_test_connections (
    job_id bigint NOT NULL,
    timeouts_pid integer NOT NULL,  -- the server process that ran the task's start
    orm_pid integer NOT NULL  -- the one behind Django's connection, which the handler's ORM uses
)
"""


def record_connections(task, timeouts_connection):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [orm_pid] = cursor.fetchone()
    _connection().execute(
        "INSERT INTO timeouts_test_connections (job_id, timeouts_pid, orm_pid) VALUES (%s, %s, %s)",
        (task.job_id, timeouts_connection.connection.info.backend_pid, orm_pid))


def close():
    global _conn
    if _conn is not None:
        _conn.close()
        _conn = None
