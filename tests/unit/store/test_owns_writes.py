"""Only timeouts/store/ changes task rows: every named query that writes timeouts_task (INSERT,
UPDATE, DELETE or COPY ... FROM into the table, one of its partitions, or a partition named at run
time), those derived in store/queries.py included, is named by a function of a module of store/,
beside the call that runs it; no other module of timeouts names one, or holds SQL of its own that
writes the table. Read from the source, so it needs no database.

A query is run by its name (store/queries.py: execute, fetch_dicts, fetch_one, fetch_values, or
QUERIES[name]), so the modules that name it, as a string, are the modules that run it, whether they
pass the name to the loader themselves or to a helper that does."""

import ast
import functools
import re
from pathlib import Path

import pytest

import timeouts
from timeouts.store import queries

PACKAGE = Path(timeouts.__file__).resolve().parent
STORE = PACKAGE / "store"
# The loader names every query it prepares or runs on a partition: that is no running of one.
LOADER = STORE / "queries.py"


_TASK_TABLE = r"(?:ONLY\s+)?(?:timeouts_task\w*|\{\w*\}|%\(\w+\)s)"
WRITES = (
    re.compile(rf"\b(?:INSERT\s+INTO|DELETE\s+FROM|UPDATE)\s+{_TASK_TABLE}", re.IGNORECASE),
    re.compile(rf"\bCOPY\s+{_TASK_TABLE}[^;]*?\bFROM\s+STDIN\b", re.IGNORECASE | re.DOTALL),
)
_COMMENT = re.compile(r"--[^\n]*")


def writes_tasks(sql: str) -> bool:
    sql = _COMMENT.sub("", sql)
    return any(pattern.search(sql) for pattern in WRITES)


def _named_queries() -> dict[str, str]:
    """Every named query of every SQL file of timeouts/sql, and the variants store/queries.py derives."""
    files = {path.name for path in (PACKAGE / "sql" / "queries").glob("*.sql")}
    assert files == set(queries.QUERY_FILES), "the loader reads every SQL file of timeouts/sql/queries"
    return dict(queries.QUERIES)


WRITING = frozenset(name for name, sql in _named_queries().items() if writes_tasks(sql))
MODULES = sorted(PACKAGE.rglob("*.py"))


def _where(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@functools.cache
def _strings(path: Path) -> tuple[str, ...]:
    """The string constants of a module, its docstrings left out (prose, which may name a query)."""
    tree = _tree(path)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return tuple(node.value for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings)


@functools.cache
def _naming() -> dict[str, frozenset[str]]:
    """Each query that writes task rows -> the modules that name it (the loader left out)."""
    naming = {name: set() for name in WRITING}
    for path in MODULES:
        if path == LOADER:
            continue
        for value in _strings(path):
            if value in naming:
                naming[value].add(_where(path))
    return {name: frozenset(modules) for name, modules in naming.items()}


def test_the_patterns_tell_writes_from_reads():
    writes = ["INSERT INTO timeouts_task (job_id) VALUES (1)", "UPDATE timeouts_task AS t SET status = 1",
              "DELETE FROM timeouts_task_default WHERE x", "WITH m AS (DELETE FROM {default} RETURNING *) SELECT 1",
              "UPDATE ONLY timeouts_task_2030_01 SET x = 1", "\nUPDATE {partition} AS timeouts_task\nSET x = 1",
              "COPY timeouts_task (job_id, biz_type) FROM STDIN"]
    reads = ["SELECT * FROM timeouts_task FOR UPDATE SKIP LOCKED", "SELECT 1 FROM timeouts_task FOR UPDATE OF t",
             "COPY (SELECT * FROM timeouts_task) TO STDOUT", "COPY timeouts_moving_rows FROM STDIN",
             "INSERT INTO timeouts_limits VALUES (1) ON CONFLICT (biz_type) DO UPDATE SET paused = true",
             "-- UPDATE timeouts_task in a comment\nSELECT 1", "SELECT last_value FROM timeouts_task_job_id_seq"]
    assert [sql for sql in writes if not writes_tasks(sql)] == []
    assert [sql for sql in reads if writes_tasks(sql)] == []


def test_every_kind_of_task_write_is_found():
    """The writes of each stage, derived ones included: a parse that missed them would pass anything."""
    assert {"insert_task", "insert_task_autocommit", "cancel_task", "reschedule_task", "requeue_task", "claim_due",
            "start_task", "fail_task", "recover_expired", "cancel_call", "tasks_backend_cancel",
            "insert_moving_rows", "delete_slot_rows", "move_parked_rows"} <= WRITING
    assert not {"find_task", "task_state", "slot_rows", "copy_moving_rows", "insert_limits_row",
                "clear_limit_shares", "nearest_deadline", "status_counts"} & WRITING


@pytest.mark.parametrize("name", sorted(WRITING))
def test_only_the_store_names_a_query_that_writes_tasks(name):
    outside = {where for where in _naming()[name] if not where.startswith("store/")}
    assert not outside, (
        f"{name} writes timeouts_task, and is run from {sorted(outside)}: run it from a function of timeouts/store/ "
        "beside the query, and call that function")


@pytest.mark.parametrize("name", sorted(WRITING))
def test_the_store_names_each_query_that_writes_tasks(name):
    """A query named by no module would be run by a name made at run time, which no check can follow."""
    assert {where for where in _naming()[name] if where.startswith("store/")}, (
        f"{name} writes timeouts_task and no module of timeouts/store/ names it")


# What store/queries.py runs or reads a query by: the name it is given is the query's.
LOADER_FUNCTIONS = frozenset({"execute", "fetch_dicts", "fetch_one", "fetch_values", "on_partition"})


def _query_names(path: Path):
    """Each expression a module hands the loader as a query's name: a call of one of its functions
    (directly, or bound by functools.partial) or a subscript of QUERIES."""
    tree = _tree(path)
    functions, tables, modules = set(), set(), set()
    if path == LOADER:
        functions, tables = set(LOADER_FUNCTIONS), {"QUERIES"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "timeouts.store.queries":
            for alias in node.names:
                if alias.name in LOADER_FUNCTIONS:
                    functions.add(alias.asname or alias.name)
                elif alias.name == "QUERIES":
                    tables.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module == "timeouts.store":
            modules.update(alias.asname or alias.name for alias in node.names if alias.name == "queries")

    def named(node, names, attributes):
        return ((isinstance(node, ast.Name) and node.id in names)
                or (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in modules and node.attr in attributes))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            args = list(node.args)
            if getattr(node.func, "id", getattr(node.func, "attr", None)) == "partial":
                if not (args and named(args[0], functions, LOADER_FUNCTIONS)):
                    continue
                args = args[1:]  # partial(fetch_one, name, ...)
            elif not named(node.func, functions, LOADER_FUNCTIONS):
                continue
            given = args[:1] or [keyword.value for keyword in node.keywords if keyword.arg == "name"]
            yield from given
        elif isinstance(node, ast.Subscript) and named(node.value, tables, {"QUERIES"}):
            yield node.slice


def _written_out(node) -> bool:
    """A literal, or a variable (whose value is a literal somewhere: the tests above find it)."""
    if isinstance(node, ast.IfExp):
        return _written_out(node.body) and _written_out(node.orelse)
    return isinstance(node, ast.Name) or (isinstance(node, ast.Constant) and node.value in queries.QUERIES)


def test_query_names_are_written_out():
    """Names the loader is given are literals of known queries, or variables holding them: never
    made at run time (an f-string, a concatenation), where none of the tests above could see a write."""
    made = [f"{_where(path)}:{node.lineno}: {ast.unparse(node)}"
            for path in MODULES for node in _query_names(path) if not _written_out(node)]
    assert made == []


def test_query_names_are_seen():
    """The loader's call sites are found: a walk that missed them would pass anything."""
    seen = {ast.unparse(node) for path in (STORE / "transitions.py", STORE / "scheduling.py", PACKAGE / "stats" /
                                           "counting.py") for node in _query_names(path)}
    assert {"'cancel_call'", "'find_task'", "'cancel_by_key'", "'lock_biz_key'", "query", "name"} <= seen


def test_no_module_outside_the_store_writes_tasks_in_sql_of_its_own():
    """Not even the DDL of partition maintenance (storage/partition_ddl.py), which composes its
    statements with identifiers: the rows it moves out of DEFAULT move through store/parked_rows.py."""
    found = {
        _where(path)
        for path in MODULES
        if not _where(path).startswith("store/") and any(writes_tasks(value) for value in _strings(path))
    }
    assert found == set(), f"SQL that writes timeouts_task outside timeouts/store/: {sorted(found)}"
