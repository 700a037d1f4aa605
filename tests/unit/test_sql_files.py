"""The SQL files of timeouts/sql: task states written as `:PENDING`, ... (timeouts/states.py), and
migration SQL that, once substituted, is the text that already ran."""

import hashlib
import re
from pathlib import Path

import pytest

from timeouts import states
from timeouts.states import Status

SQL_DIR = Path(states.__file__).with_name("sql")
SQL_FILES = sorted(SQL_DIR.glob("*.sql"))

# A status compared with, or set to, a number.
BARE_STATUS_NUMBER = [
    re.compile(r"\bstatus\s*(?:=|<>|!=|<=|>=|<|>)\s*\d"),
    re.compile(r"\bstatus\s+(?:NOT\s+)?IN\s*\([^)]*\d", re.IGNORECASE),
    re.compile(r"\bstatus\s+BETWEEN\s+\d|\bstatus\s+BETWEEN\s+\S+\s+AND\s+\d", re.IGNORECASE),
    re.compile(r"\bstatus\s*,[^)]*\)\s*IS\s+(?:NOT\s+)?DISTINCT\s+FROM\s*\(\s*\d", re.IGNORECASE),
    re.compile(r"\bstatus\s*=\s*CASE\b(?:(?!\bEND\b).)*?\b(?:THEN|ELSE)\s+\d", re.IGNORECASE | re.DOTALL),
    re.compile(r"\bstatus\s+smallint\b[^,]*\bDEFAULT\s+\d", re.IGNORECASE),
]

# sha256 of each migration SQL file after substitution: the text every existing database ran.
MIGRATED = {
    "0001_schema.sql": "62e905c5a2a74dbaaa0620b901c3338aebd64f939c3acc5cffb0aecd31608d40",
    "0001_schema_reverse.sql": "3365fbd341a44f8052280f87b0a5013ef8c636ed7969312bcd7f531fb917a0a5",
    "0002_notify.sql": "53073117303c01bc37ccc290d6998ead862703a8bc340629cdf1260393581a06",
    "0002_notify_reverse.sql": "55011e5005309992ce597e8a06de4556fef892ce04b0f238d56f2224dd6b8a5b",
    "0003_admin_indexes.sql": "b84f4444bfc4bfd2cd617f3c8e76fb8d22adebd7e18fea3432cec3c49638c25d",
    "0003_admin_indexes_reverse.sql": "000992dba08be07a59ecfe400746ee41cdffe4e40445e7118c1d2cb0f4fc059c",
    "0004_task_results.sql": "7ea7f291901f773430a8f8ff12c673545b34c60183b58836d7c67b7f1eaf5d64",
    "0004_task_results_reverse.sql": "90e27394f99495c48865f52ca0b67123424e6cb23cf99f1545f470519b4b8b0f",
    "0005_limits.sql": "5aab8ed185b3088801adb4759d5c079a82dbb1601ef4fe8978e59f5bfa0ccafd",
    "0005_limits_reverse.sql": "97bdcb154b1ba8e5063d4937ce5f316cc6c545e3e3111cfe9109a91d2a41b93d",
    "0006_limit_shares.sql": "498552fd85e06856c2d3d0e121f0d9f3125da04c8d707afeaf39f17301482891",
    "0006_limit_shares_reverse.sql": "ccd6dbea21fd8e7e619c16f4f3624c9dc7da5db93dcae4aa4437879ed77e7331",
}


def test_the_state_numbers_are_the_public_ones():
    assert {s.name: s.value for s in Status} == {
        "PENDING": 0, "DISPATCHED": 1, "DONE": 2, "CANCELLED": 3, "RUNNING": 4, "DEAD": 5}


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda p: p.name)
def test_no_status_is_compared_with_a_bare_number(path):
    text = path.read_text()
    found = [m.group(0) for pattern in BARE_STATUS_NUMBER for m in pattern.finditer(text)]
    assert not found, f"{path.name}: write the states as :PENDING, :DONE, ...: {found}"


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda p: p.name)
def test_every_placeholder_is_a_known_state(path):
    names = set(states.PLACEHOLDER.findall(path.read_text()))
    assert names <= set(Status.names), f"{path.name}: unknown {names - set(Status.names)}"
    assert not states.PLACEHOLDER.findall(states.substitute(path.read_text()))


def test_the_patterns_catch_bare_numbers():
    bad = ["WHERE status = 0", "status IN (1, 4)", "status NOT IN (:DONE, 4)", "status BETWEEN 0 AND :DEAD",
           "(status, attempts) IS NOT DISTINCT FROM (1, %(attempt)s)", "SET status = CASE WHEN x THEN 5 ELSE 0 END",
           "status        smallint     NOT NULL DEFAULT 0,"]
    for text in bad:
        assert any(p.search(text) for p in BARE_STATUS_NUMBER), text
    good = ["WHERE status = :PENDING AND attempts = 0", "SET status = CASE WHEN attempts > 1 THEN :DEAD END, x = 1"]
    for text in good:
        assert not any(p.search(text) for p in BARE_STATUS_NUMBER), text


def test_substitute_replaces_states_and_leaves_casts_alone():
    sql = "SELECT 'a'::text, x::TEXT, :PENDING, (:DEAD), '12:00', status IN (:DISPATCHED,:RUNNING)"
    assert states.substitute(sql) == "SELECT 'a'::text, x::TEXT, 0, (5), '12:00', status IN (1,4)"
    with pytest.raises(ValueError, match=":PAUSED"):
        states.substitute("WHERE status = :PAUSED")


@pytest.mark.parametrize("name", sorted(MIGRATED))
def test_migration_sql_that_ran_never_changes(name):
    from timeouts.migrations import read_sql_file

    text = read_sql_file(name)
    assert hashlib.sha256(text.encode()).hexdigest() == MIGRATED[name], (
        f"{name} already ran on existing databases: put a change in a new migration")


def _package_sources(exclude=()):
    package = SQL_DIR.parent
    return {path: path.read_text() for path in package.rglob("*.py") if path.name not in exclude}


def test_every_named_query_is_used():
    from timeouts import queries

    sources = _package_sources(exclude={"queries.py"})
    unused = [name for name in queries.QUERIES
              if not any(re.search(rf"[\"']{name}[\"']", text) for text in sources.values())]
    assert not unused, f"named queries no code runs: {unused}"
    # The sets of queries.py's rules name real queries.
    assert queries.PREPARED <= set(queries.QUERIES) and queries.ON_PARTITION <= set(queries.QUERIES)


def test_every_sql_file_is_read_once():
    from timeouts import queries

    migrations = {path.name: text for path, text in _package_sources().items() if path.parent.name == "migrations"}
    for path in SQL_FILES:
        if path.name in queries.QUERY_FILES:
            continue
        users = [name for name, text in migrations.items() if re.search(rf"[\"']{re.escape(path.name)}[\"']", text)]
        assert len(users) == 1, f"{path.name} is used by {users or 'no migration'}: each by exactly one"
