"""Named SQL queries, read once from the files in QUERY_FILES.

Every runtime query lives under a `-- name: <name>` header in one of the QUERY_FILES of
`sql/queries/`, a file per subject (scheduling, claims, attempts, transitions, partitions, stats,
...), so the SQL that runs in production can be read, reviewed and EXPLAINed in one place. The line
right under the header says what the query does (DESCRIPTIONS); a longer explanation, if any,
follows after a bare `--` line.

A piece of SQL that several queries share (a CTE, a subquery) is written once, under a
`-- part: <name>` header, and a query takes it in with a line that starts with `{<name>}` (indented as
that line is; the rest of the line follows it). Two kinds of variant are derived from the queries
here, by one checked text replacement each, rather than written out again: insert_task_autocommit,
and the worker's updates run on one partition (on_partition()). A query that names the partition
it works on writes `{partition}`, which on_partition() fills in too.
"""

import functools
import re
from pathlib import Path
from weakref import WeakKeyDictionary

import psycopg
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.types.datetime import TimestamptzLoader

from timeouts.states import substitute
from timeouts.store import worker_connection

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
_HEADER = re.compile(r"^-- (name|part): ([a-z_]+)\s*$", re.MULTILINE)
# A part taken in: `{name}` first on its line, after the indentation.
_INCLUDE = re.compile(r"^([ \t]*)\{([a-z_]+)\}", re.MULTILINE)
# The line under a header: what the query does, in one line, then the SQL or a bare `--` line.
_DESCRIPTION = re.compile(r"-- (\S[^\n]*)\n(?!-- )")


def sections(text: str, kind: str = "name") -> dict[str, str]:
    """The texts under the `-- <kind>: <name>` headers of `text` (`name`: queries, `part`: parts), by
    name, as written."""
    pieces = _HEADER.split(text)
    found = {}
    for header, name, body in zip(pieces[1::3], pieces[2::3], pieces[3::3], strict=True):
        if header != kind:
            continue
        if name in found:
            raise ValueError(f"{kind} {name!r} is defined twice")
        found[name] = body.strip()
    return found


def description(text: str) -> str | None:
    """What a query (or part) does: the one line right under its header, or None without one."""
    match = _DESCRIPTION.match(text + "\n")
    return match.group(1).strip() if match else None


def include(text: str, parts: dict[str, str]) -> str:
    """`text` with every `{name}` line start replaced by that part, each of its lines indented as the marker."""

    def part(match):
        indent, name = match.groups()
        if name not in parts:
            raise ValueError(f"unknown SQL part {{{name}}}; known: {', '.join(sorted(parts))}")
        return indent + parts[name].replace("\n", "\n" + indent)

    return _INCLUDE.sub(part, text)


def parse(text: str, parts: dict[str, str] | None = None) -> dict[str, str]:
    """The queries of `text` by name, each with the parts it takes in: those `text` defines, and
    `parts`. A file read on its own (an older commit's, say) then gives the queries that run."""
    known = {**(parts or {}), **sections(text, "part")}
    return {name: include(body, known) for name, body in sections(text).items()}


# Every file of sql/queries/, one subject each (the claims, an attempt, partitions, stats, ...).
QUERY_FILES = tuple(sorted(path.name for path in (SQL_DIR / "queries").glob("*.sql")))


def _read(kind):
    found = {}
    for file in QUERY_FILES:
        for name, body in sections(substitute((SQL_DIR / "queries" / file).read_text()), kind).items():
            if name in found:
                raise ValueError(f"{kind} {name!r} is defined in two files")
            found[name] = body
    return found


def _load():
    parts, written = _read("part"), _read("name")
    if any(_INCLUDE.search(body) for body in parts.values()):
        raise ValueError("an SQL part takes in no other part")
    taken = {match.group(2) for body in written.values() for match in _INCLUDE.finditer(body)}
    if set(parts) - taken:
        raise ValueError(f"SQL parts no query takes in: {sorted(set(parts) - taken)}")
    return {name: include(body, parts) for name, body in written.items()}, parts


QUERIES, PARTS = _load()
# What each query does, from the line under its header (None: it has none; test_sql_files keeps every one).
DESCRIPTIONS = {name: description(text) for name, text in QUERIES.items()}

# insert_task for a statement that is its own transaction (schedule() outside any atomic block, the
# common case): it can notify at most once anyway, so it calls pg_notify() itself, with the payload
# timeouts_notify_v1 sends (the deadline as Unix epoch seconds), and skips the PL/pgSQL call and its
# once-per-transaction bookkeeping, on the hot path of a task that notifies. pg_notify() returns
# void, which IS NOT NULL: `notified` reads true when it notified, as from insert_task. Derived
# rather than written out twice, so the two cannot drift.
NOTIFY_ONCE_PER_TRANSACTION = (
    "THEN timeouts_notify_v1(%(channel)s, run_at, created_at + %(horizon)s * interval '1 second')")
NOTIFY_ITSELF = "THEN pg_notify(%(channel)s, extract(epoch FROM run_at)::text) IS NOT NULL"
if QUERIES["insert_task"].count(NOTIFY_ONCE_PER_TRANSACTION) != 1:
    raise ValueError(f"insert_task must notify exactly once through {NOTIFY_ONCE_PER_TRANSACTION!r}")
QUERIES["insert_task_autocommit"] = QUERIES["insert_task"].replace(NOTIFY_ONCE_PER_TRANSACTION, NOTIFY_ITSELF)
# schedule_keyed runs only as its own transaction, so it always notifies so.
if QUERIES["schedule_keyed"].count(NOTIFY_ONCE_PER_TRANSACTION) != 1:
    raise ValueError(f"schedule_keyed must notify exactly once through {NOTIFY_ONCE_PER_TRANSACTION!r}")
QUERIES["schedule_keyed"] = QUERIES["schedule_keyed"].replace(NOTIFY_ONCE_PER_TRANSACTION, NOTIFY_ITSELF)

# The queries every task runs: schedule()'s INSERT (and, with on_conflict, the default, the key's
# lock and the read of its waiting task before it; with "debounce", the move), the claim, the
# worker's compare-and-set and its outcome. They bind parameters on the server, so psycopg can
# prepare them: PostgreSQL then skips parsing them, and for the INSERT and the claim planning too
# (docs: explanation/benchmarks). Django turns preparing off unless the host sets DATABASES OPTIONS
# "prepare_threshold" (not behind a pooler that cannot keep prepared statements); the connection of
# a worker or dispatcher of its own prepares unless OPTIONS say None (worker_connection.py).
# Django's own cursors bind on the client and never prepare, so nothing else of the host's changes.
# A migration that adds a column is harmless: psycopg prepares again (test_prepared.py).
PREPARED = frozenset({"insert_task", "insert_task_autocommit", "schedule_keyed", "lock_biz_key",
                      "waiting_tasks_for_key",
                      "debounce_task", "claim_due", "start_task", "finish_task",
                      "finish_then_start_task", "fail_task", "confirm_start", "start_calls_ahead",
                      "tasks_backend_started", "tasks_backend_returned", "tasks_backend_failed"})


def execute(name, params=None, *, using=None, partition=None):
    """Run a named query and return the cursor (rows not fetched): on `using` (a Django connection, or
    a bare psycopg one, whose cursors bind on the server already), else on the connection timeouts'
    statements use in this thread (worker_connection.current(): Django's, or a worker's own).
    `partition`: run one of the ON_PARTITION queries on that partition of timeouts_task, or one of
    NAMING_A_PARTITION on it (those need one)."""
    db = using or worker_connection.current()
    if name in PREPARED and isinstance(db, BaseDatabaseWrapper):
        cursor = _kept_cursor(db, name)
    else:
        cursor = db.cursor()
    cursor.execute(QUERIES[name] if partition is None else on_partition(name, partition), params)
    return cursor


# The worker's one-row UPDATEs, which it can run on the partition that holds the task (the claim
# returns it, the message carries it). Through the partitioned parent, PostgreSQL plans such an
# UPDATE on every call, even prepared (a generic plan could not prune partitions before running);
# on the partition itself the prepared plan is reused (for a stored Celery call's outcome, docs:
# explanation/benchmarks). on_partition() makes two changes:
# - PARENT_UPDATE: the table updated;
# - PARENT_KEY: the lookup. A partition's statistics can be older than a burst scheduled into it,
#   and describe its tasks as due one by one, none of them claimed or running. PostgreSQL then
#   rates the admin's (action_time) index for `action_time = $2`, and the partial lease index for
#   `status = :RUNNING`, as good as the primary key and cheaper: it takes one, and reads every task due at
#   that instant, or every running one, to find one, so n tasks due together cost n * n row reads.
#   Compared with IS NOT DISTINCT FROM (`=` for these NOT NULL columns), neither is an index condition, so only
#   the primary key (job_id first) can serve the lookup. The parent keeps `action_time = $2`, which
#   it needs to prune partitions; both queries compare the state so themselves.
ON_PARTITION = frozenset({"start_task", "finish_task", "finish_then_start_task", "end_call", "confirm_start",
                          "tasks_backend_started", "tasks_backend_returned", "tasks_backend_failed"})
PARENT_UPDATE = "\nUPDATE timeouts_task\n"
PARENT_KEY = re.compile(r"WHERE job_id = (%\(\w+\)s) AND action_time = (%\(\w+\)s)")
PARTITION_KEY = r"WHERE job_id = \1 AND action_time IS NOT DISTINCT FROM \2"
for _name in ON_PARTITION:  # one key per UPDATE (finish_then_start_task has two)
    if not QUERIES[_name].count(PARENT_UPDATE) == len(PARENT_KEY.findall(QUERIES[_name])) >= 1:
        raise ValueError(f"query {_name!r} must update through {PARENT_UPDATE.strip()!r} by {PARENT_KEY.pattern!r}")
# The queries that name the partition they work on where they write PARTITION_SLOT (moving the rows
# parked in DEFAULT into the partition made for them, partition_ddl.py): run on one only.
PARTITION_SLOT = "{partition}"
NAMING_A_PARTITION = frozenset(name for name, text in QUERIES.items() if PARTITION_SLOT in text)
# The names of timeouts' own partitions (partitions.py), which need no quoting. A message's
# partition is spliced into SQL, so only such a name ever is; for any other (a partition in a schema
# outside the search_path comes back qualified) the task runs through the parent.
PARTITION_NAME = re.compile(r"timeouts_task_[a-z0-9_]{1,49}")


def is_partition_name(name) -> bool:
    return isinstance(name, str) and PARTITION_NAME.fullmatch(name) is not None


@functools.lru_cache(maxsize=1024)
def on_partition(name: str, partition: str) -> str:
    """The text of query `name` run on `partition`: instead of on the partitioned parent (ON_PARTITION),
    or where it names its partition (NAMING_A_PARTITION)."""
    if name not in ON_PARTITION | NAMING_A_PARTITION or not is_partition_name(partition):
        raise ValueError(f"query {name!r} cannot run on partition {partition!r}")
    if name in NAMING_A_PARTITION:
        return QUERIES[name].replace(PARTITION_SLOT, partition)
    query = QUERIES[name].replace(PARENT_UPDATE, f"\nUPDATE {partition} AS timeouts_task\n")
    return PARENT_KEY.sub(PARTITION_KEY, query)


class _KeptCursor(psycopg.Cursor):
    """psycopg's server-side binding cursor, kept for every run of one prepared query on one
    connection. psycopg caches the parameter dumpers and column loaders per cursor, so a new cursor
    per call looks them all up again, on every call of the hot path (and so does the client-side
    cursor Django's cursor() builds first). Closing it is a no-op: it holds no server resource, and
    it goes with its connection."""

    def __init__(self, connection, timezone):
        super().__init__(connection)
        # Django reads timestamptz through a loader of its own, written in Python, which parses the
        # text and then sets Django's time zone. psycopg's own (compiled) loader gives the same
        # datetimes whenever the session's time zone is Django's, which Django sets when it connects.
        # The worker's start returns seven timestamps, and schedule() some too: the compiled loader
        # spares CPU on every task. A cursor made on a connection in another zone (a host's SET TIME ZONE,
        # USE_TZ off) keeps Django's loader, so its rows read as the ORM's do; one made before such
        # a SET goes on reading the same instants, in the session's new zone.
        if timezone is not None and connection.info.timezone == timezone:
            self.adapters.register_loader("timestamptz", TimestamptzLoader)

    def close(self):
        pass


# Django connection (one per thread and alias) -> (its psycopg connection, {query name: kept cursor}).
# Keyed by Django's wrapper, which outlives its psycopg connections: a cursor holds its connection,
# so a cache keyed by the psycopg connection would keep every closed one alive (a web process with
# CONN_MAX_AGE = 0 opens one per request). The cursors of a closed connection go at the next call.
_KEPT: "WeakKeyDictionary[BaseDatabaseWrapper, tuple]" = WeakKeyDictionary()


def _kept_cursor(db, name):
    """Django's cursor wrapper (error translation, query logging, execute_wrapper hooks) around the
    kept cursor: the steps of Django's own cursor(), without building a cursor to throw away."""
    cursor = _kept(db, name)
    return db.make_debug_cursor(cursor) if db.queries_logged else db.make_cursor(cursor)


def _kept(db, name) -> "_KeptCursor":
    """The kept cursor of query `name` on `db`, after the checks Django's cursor() makes first."""
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    owner, cursors = _KEPT.get(db, (None, None))
    if owner is not db.connection:
        cursors = {}
        _KEPT[db] = (db.connection, cursors)
    cursor = cursors.get(name)
    if cursor is None:
        cursor = cursors[name] = _KeptCursor(db.connection, db.timezone)
    return cursor


def fetch_dicts(name, params=None, *, using=None, partition=None) -> list[dict]:
    with execute(name, params, using=using, partition=partition) as cursor:
        columns = _column_names(cursor)
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def _column_names(cursor) -> list[str]:
    """The result's column names, read off the libpq result. psycopg builds `cursor.description`
    anew for every result, a Column per column with its type looked up, on every task; the names
    alone are all the rows need."""
    result = getattr(cursor, "cursor", cursor).pgresult  # Django's CursorWrapper, or a bare cursor
    return [result.fname(i).decode() for i in range(result.nfields)]


def fetch_one(name, params=None, *, using=None, partition=None) -> dict | None:
    rows = fetch_dicts(name, params, using=using, partition=partition)
    return rows[0] if rows else None


def fetch_values(name, params=None, *, using=None) -> tuple | None:
    """The first row as a tuple, in the query's column order, for schedule()'s hot path, which
    reads it by position: no column names, no dict."""
    db = using or worker_connection.current()
    if name in PREPARED and isinstance(db, BaseDatabaseWrapper) and not db.execute_wrappers \
            and not db.queries_logged:
        # What Django's cursor wrapper would do around the kept cursor, with no execute_wrapper
        # hook to call and no query to log: refuse to run in a broken transaction, and translate
        # psycopg's errors into Django's, for the statement and its fetch. Without building the
        # wrapper, and the error-translating closure its fetchone() builds on every call.
        cursor = _kept(db, name)
        db.validate_no_broken_transaction()
        with db.wrap_database_errors:
            cursor.execute(QUERIES[name], params)
            return cursor.fetchone()
    with execute(name, params, using=using) as cursor:
        return cursor.fetchone()
