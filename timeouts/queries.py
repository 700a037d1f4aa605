"""Named SQL queries, read once from the files in QUERY_FILES.

Every runtime query lives under a `-- name: <name>` header in `sql/queries.sql` (tasks) or
`sql/partitions.sql` (partition maintenance) or `sql/dispatcher.sql` (the dispatcher), so the SQL that runs in production can be read,
reviewed and EXPLAINed in one place.
"""

import re
from pathlib import Path

import psycopg
from django.db import connection
from django.db.backends.utils import CursorWrapper

SQL_DIR = Path(__file__).with_name("sql")
_HEADER = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    parts = _HEADER.split(text)
    queries = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.strip()
    return queries


QUERY_FILES = ("queries.sql", "partitions.sql", "dispatcher.sql")


def _load():
    queries = {}
    for name in QUERY_FILES:
        for query, body in parse((SQL_DIR / name).read_text()).items():
            if query in queries:
                raise ValueError(f"query {query!r} is defined in two files")
            queries[query] = body
    return queries


QUERIES = _load()

# The queries every task runs: schedule()'s INSERT, the claim, the worker's compare-and-set and its
# outcome. They bind parameters on the server, so psycopg can prepare them: PostgreSQL then skips
# parsing them, and for the INSERT and the claim planning too (measured side by side: the claim at
# half the cost, schedule() a quarter less; BENCHMARKS.md). Django turns preparing off unless the
# host sets DATABASES OPTIONS "prepare_threshold" (not behind a pooler that cannot keep prepared
# statements); its own cursors bind on the client and never prepare, so nothing else of the host's
# changes. A migration that adds a column is harmless: psycopg prepares again (test_prepared.py).
PREPARED = frozenset({"insert_task", "claim_due", "start_task", "finish_task", "fail_task"})


def execute(name, params=None, *, using=None):
    """Run a named query on Django's connection (or `using`: another Django connection, or a bare
    psycopg one, whose cursors bind on the server already) and return the cursor (rows not fetched)."""
    cursor = (using or connection).cursor()
    if name in PREPARED and isinstance(cursor, CursorWrapper):
        # Django's wrapper (error translation, query logging, execute_wrapper hooks) stays; only the
        # psycopg cursor inside it changes, to psycopg's server-side binding one.
        cursor.cursor = psycopg.Cursor(cursor.db.connection)
    cursor.execute(QUERIES[name], params)
    return cursor


def fetch_dicts(name, params=None, *, using=None) -> list[dict]:
    with execute(name, params, using=using) as cursor:
        columns = [column.name for column in cursor.description]
        return [dict(zip(columns, row)) for row in cursor.fetchall()]


def fetch_one(name, params=None, *, using=None) -> dict | None:
    rows = fetch_dicts(name, params, using=using)
    return rows[0] if rows else None
