"""Timeouts' SQL keeps clear of part of what Citus refuses in a query routed to one shard: no
volatile function in an UPDATE's SET (an upsert's DO UPDATE SET included) nor in a RETURNING list,
but for the NOTIFYs listed below; and row locks taken only on one of timeouts' tables, in
statements that read nothing else. Citus refuses more, which the statements do not keep clear of
(docs: explanation/shards). Checked on the parse tree of every query, with no database: pglast is
PostgreSQL's own parser."""

import re

import pglast
import pytest
from pglast import ast
from pglast.visitors import Visitor

from timeouts.store import queries

pytestmark = pytest.mark.timeout(30)

# Volatile functions (pg_proc.provolatile = 'v'): a fixed list, as a unit test has no database to
# ask. Those the queries call, and the usual others a query might come to call. Not txid_current()
# nor pg_current_xact_id(): they are STABLE.
VOLATILE = frozenset({
    "clock_timestamp", "timeofday", "random", "random_normal", "setseed", "gen_random_uuid",
    "uuid_generate_v4", "nextval", "currval", "lastval", "setval", "pg_notify", "set_config",
    "pg_sleep", "pg_total_relation_size", "pg_advisory_lock", "pg_advisory_xact_lock",
    "pg_advisory_xact_lock_shared", "pg_try_advisory_lock", "pg_try_advisory_xact_lock",
    "pg_advisory_unlock", "pg_logical_emit_message",
    "timeouts_notify_v1",  # sql/migrations/0001_notify.sql: PL/pgSQL, volatile by default (and it NOTIFYs)
    "timeouts_debounce_v1",  # sql/migrations/0001_debounce.sql: PL/pgSQL, volatile (it locks, moves and NOTIFYs)
    "timeouts_waiting_for_key_v1",  # sql/migrations/0001_keyed_schedule.sql: PL/pgSQL, volatile (it locks)
    "timeouts_waiting_for_key_v2",  # sql/migrations/0002_keyed_schedule.sql: PL/pgSQL, volatile (it locks)
})
# The other functions the queries call, STABLE or IMMUTABLE. A query that calls a function in
# neither list fails test_every_function_a_query_calls_is_classified: add it to the right one
# (`SELECT proname, provolatile FROM pg_proc WHERE proname = '...'`), so the list stays whole.
NOT_VOLATILE = frozenset({
    "count", "min", "max", "sum", "array_agg", "row_number", "percentile_cont", "floor", "unnest",
    "generate_series", "extract", "date_trunc", "format", "hashtext", "regexp_match", "jsonb_build_array",
    "jsonb_build_object", "now", "statement_timestamp", "current_setting", "pg_get_expr", "obj_description",
    "starts_with", "round", "trim_scale",
    # sql/migrations/0001_limits.sql: IMMUTABLE, but timeouts_bucket_full_at STABLE
    "timeouts_rate_part", "timeouts_concurrency_part", "timeouts_bucket_tokens", "timeouts_bucket_full_at",
})

# The NOTIFY that wakes the dispatchers rides on the write whose deadline it announces: one round
# trip for both. These queries, and only these, call it in their RETURNING list. Citus refuses it
# there, and a NOTIFY raised on a Citus worker node reaches only that node's LISTENers: what that
# means for the dispatcher is in docs: explanation/shards.
NOTIFY_IN_RETURNING = {
    "insert_task": "timeouts_notify_v1",
    "insert_task_autocommit": "pg_notify",
    "schedule_keyed": "pg_notify",
    "reschedule_task": "timeouts_notify_v1",
    "requeue_task": "timeouts_notify_v1",
    "reschedule_by_key": "timeouts_notify_v1",
    "requeue_latest_of_key": "timeouts_notify_v1",
    "release_claims": "timeouts_notify_v1",
    "give_back_call_starts": "timeouts_notify_v1",
    "fail_task": "timeouts_notify_v1",
    "recover_expired": "timeouts_notify_v1",
    "override_limits": "timeouts_notify_v1",
    "reset_limits": "timeouts_notify_v1",
    "pause_biz_type": "timeouts_notify_v1",
}

# The tables a statement that locks rows may read: every one of them is in the shard's database
# (or schema), so a statement over them alone is a single-shard one.
LOCKABLE = frozenset({"timeouts_task", "timeouts_limits"})

PARAMETER = re.compile(r"%\(\w+\)s")
A_PARTITION = "timeouts_task_d20260101"


def _statements() -> dict[str, str]:
    """Every query timeouts runs, by name: the named ones (derived variants included, those that
    name their partition with one filled in) and the worker's updates as run on one partition."""
    found = {name: queries.on_partition(name, A_PARTITION) if name in queries.NAMING_A_PARTITION else text
             for name, text in queries.QUERIES.items()}
    for name in sorted(queries.ON_PARTITION):
        found[f"{name}@partition"] = queries.on_partition(name, A_PARTITION)
    return found


STATEMENTS = _statements()


def parse(text: str):
    # Parameters become NULL (what they stand for does not matter here), %% the % it escapes.
    return pglast.parse_sql(PARAMETER.sub("NULL", text).replace("%%", "%"))


class _Collect(Visitor):
    """The nodes of a tree of one type, nested ones included."""

    def __init__(self, node_type):
        super().__init__()
        self.node_type = node_type
        self.found = []

    def visit(self, ancestors, node):
        if isinstance(node, self.node_type):
            self.found.append(node)


def nodes(tree, node_type) -> list:
    if tree is None:  # a clause the statement does not have
        return []
    collect = _Collect(node_type)
    collect(tree)
    return collect.found


def function_name(call: ast.FuncCall) -> str:
    return ".".join(part.sval for part in call.funcname).removeprefix("pg_catalog.")


def volatile_calls(tree, allowed=None) -> list[str]:
    """The volatile functions called anywhere in `tree` (the arguments of `allowed` too)."""
    names = (function_name(call) for call in nodes(tree, ast.FuncCall))
    return [name for name in names if name in VOLATILE and name != allowed]


def findings(text: str, notify=None) -> list[str]:
    """What Citus would refuse in `text` among the rules above; `notify`: the function the query may
    call in its RETURNING list."""
    found = []
    tree = parse(text)
    for update in nodes(tree, ast.UpdateStmt):
        found += [f"{name}() in an UPDATE's SET" for name in volatile_calls(update.targetList)]
    for insert in nodes(tree, ast.InsertStmt):
        if insert.onConflictClause is not None:
            found += [f"{name}() in DO UPDATE SET" for name in volatile_calls(insert.onConflictClause.targetList)]
    for write in nodes(tree, (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)):
        found += [f"{name}() in RETURNING" for name in volatile_calls(write.returningList, allowed=notify)]
    found += _lock_findings(tree)
    return found


def _lock_findings(tree) -> list[str]:
    locking = [select for select in nodes(tree, ast.SelectStmt) if select.lockingClause]
    if not locking:
        return []
    found = []
    ctes = {cte.ctename for cte in nodes(tree, ast.CommonTableExpr)}
    # `FOR UPDATE OF l` names an item of the FROM list (by its alias), which is checked there.
    named_by_of = {rel.relname for clause in nodes(tree, ast.LockingClause) for rel in clause.lockedRels or ()}
    tables = {table.relname for table in nodes(tree, ast.RangeVar)} - ctes - named_by_of
    if not tables <= LOCKABLE:
        found.append(f"a statement that locks rows reads {sorted(tables - LOCKABLE)}")
    for select in locking:
        items = list(select.fromClause or ())
        locked = []
        while items:  # the FROM list, joins opened up
            item = items.pop()
            if isinstance(item, ast.JoinExpr):
                items += [item.larg, item.rarg]
            elif isinstance(item, ast.RangeVar):
                if item.relname not in ctes:
                    locked.append(item.relname)
            else:
                found.append(f"FOR UPDATE over a {type(item).__name__}")
        if len(locked) != 1 or locked[0] not in LOCKABLE:
            found.append(f"FOR UPDATE over {sorted(locked)}: one of {sorted(LOCKABLE)} at a time")
    return found


def test_every_query_parses_to_statements():
    for name, text in STATEMENTS.items():
        assert parse(text), name


def test_every_function_a_query_calls_is_classified():
    assert not VOLATILE & NOT_VOLATILE
    called = {function_name(call) for text in STATEMENTS.values() for call in nodes(parse(text), ast.FuncCall)}
    assert called <= VOLATILE | NOT_VOLATILE, (
        f"classify {sorted(called - VOLATILE - NOT_VOLATILE)} in VOLATILE or NOT_VOLATILE")


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_no_query_uses_what_citus_refuses_in_a_single_shard_query(name):
    notify = NOTIFY_IN_RETURNING.get(name.removesuffix("@partition"))
    assert findings(STATEMENTS[name], notify=notify) == []


@pytest.mark.parametrize("name", sorted(NOTIFY_IN_RETURNING))
def test_each_listed_notify_is_still_in_its_query_returning_list(name):
    # A query that no longer notifies leaves the list: it must not keep an allowance it has no use for.
    returning = [write.returningList for write in nodes(parse(STATEMENTS[name]), (ast.InsertStmt, ast.UpdateStmt))]
    called = {function_name(call) for entries in returning for call in nodes(entries, ast.FuncCall)}
    assert NOTIFY_IN_RETURNING[name] in called


@pytest.mark.parametrize("sql, expected", [
    ("UPDATE timeouts_task SET modified_at = clock_timestamp()", ["clock_timestamp() in an UPDATE's SET"]),
    ("UPDATE timeouts_task SET ttr = (SELECT floor(random() * 10))", ["random() in an UPDATE's SET"]),
    ("UPDATE timeouts_task SET ttr = 1 RETURNING job_id, clock_timestamp()", ["clock_timestamp() in RETURNING"]),
    ("DELETE FROM timeouts_task RETURNING pg_notify('c', 'x')", ["pg_notify() in RETURNING"]),
    ("WITH u AS (UPDATE timeouts_task SET ttr = 1 RETURNING nextval('s')) SELECT * FROM u",
     ["nextval() in RETURNING"]),
    ("INSERT INTO timeouts_limits (biz_type) VALUES ('a') ON CONFLICT (biz_type) DO UPDATE"
     " SET modified_at = clock_timestamp()", ["clock_timestamp() in DO UPDATE SET"]),
    ("UPDATE timeouts_task SET ttr = 1 RETURNING timeouts_notify_v1('c', run_at, clock_timestamp())",
     ["timeouts_notify_v1() in RETURNING", "clock_timestamp() in RETURNING"]),
    ("SELECT * FROM timeouts_task JOIN orders USING (biz_id) FOR UPDATE",
     ["a statement that locks rows reads ['orders']",
      "FOR UPDATE over ['orders', 'timeouts_task']: one of ['timeouts_limits', 'timeouts_task'] at a time"]),
    ("SELECT * FROM (SELECT * FROM timeouts_task) AS t FOR UPDATE",
     ["FOR UPDATE over a RangeSubselect",
      "FOR UPDATE over []: one of ['timeouts_limits', 'timeouts_task'] at a time"]),
    ("SELECT * FROM timeouts_task WHERE biz_id IN (SELECT id FROM orders) FOR UPDATE SKIP LOCKED",
     ["a statement that locks rows reads ['orders']"]),
])
def test_the_checks_catch_what_citus_refuses(sql, expected):
    assert findings(sql) == expected


def test_the_checks_let_the_usual_shapes_through():
    good = [
        "UPDATE timeouts_task SET modified_at = c.now FROM (SELECT clock_timestamp() AS now) AS c RETURNING c.now",
        "UPDATE timeouts_task SET ttr = 1 RETURNING timeouts_notify_v1('c', run_at, modified_at)",
        "INSERT INTO timeouts_task (job_id) VALUES (nextval('timeouts_task_job_id_seq') * 1024 + 7)",
        "WITH l AS (SELECT biz_type FROM timeouts_limits) SELECT * FROM timeouts_limits AS t JOIN l USING (biz_type)"
        " FOR UPDATE OF t SKIP LOCKED",
    ]
    for sql in good:
        assert findings(sql, notify="timeouts_notify_v1") == [], sql
