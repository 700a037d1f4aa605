"""The SQL files of timeouts/sql: task states written as `:PENDING`, ... (timeouts/states.py); the
runtime query files in timeouts/sql, the migrations' in timeouts/sql/migrations, each read once; and
migration SQL that, once substituted, is the text that already ran."""

import hashlib
import re
from pathlib import Path

import pytest

from timeouts import states
from timeouts.states import Status

SQL_DIR = Path(states.__file__).with_name("sql")
MIGRATION_SQL_DIR = SQL_DIR / "migrations"
QUERY_SQL_DIR = SQL_DIR / "queries"
SQL_FILES = sorted(SQL_DIR.rglob("*.sql"))

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
    "0001_debounce.sql": "d206852e74f16c195e41767f7675cba9c266b6b62b831d96b1c7a84e602020bf",
    "0001_debounce_reverse.sql": "fc3791ecb45c40ea014e4c9d500ad47b9dc92c301c48773bf85688a7c16ea4e7",
    "0001_keyed_schedule.sql": "dc6d87d9ad25034325f5a9bd599246a19306dacf0c5b61220c28643d86bb2473",
    "0001_keyed_schedule_reverse.sql": "8ed270be34953bfe62a4b4db453716ec2c96f41d4f3fd0f29d60666e31cd671c",
    "0001_last_claims.sql": "beae14cbd3a86f681d1a98b972af26b923311c522ebf577c487c54618d2d639a",
    "0001_last_claims_reverse.sql": "49ce3707ea3448bb7a833c9dece3c3eece1fd686b3244d19ce7a4cb038a67097",
    "0001_limits.sql": "433254145d46c4a25191ad496c34fe30cd6c0ddce21ca1443978c2104399a3df",
    "0001_limits_reverse.sql": "faa48c0cc4f9424b6978b89b03eaa7391343cf04f29451d5066de353a83d45df",
    "0001_notify.sql": "53073117303c01bc37ccc290d6998ead862703a8bc340629cdf1260393581a06",
    "0001_notify_reverse.sql": "55011e5005309992ce597e8a06de4556fef892ce04b0f238d56f2224dd6b8a5b",
    "0001_tasks.sql": "87b8d101da5ffcd153f24acc73aa0c2f5f327f784b30a99cc1c00868d2dec900",
    "0001_tasks_reverse.sql": "3365fbd341a44f8052280f87b0a5013ef8c636ed7969312bcd7f531fb917a0a5",
    "0002_keyed_schedule.sql": "d6f260d5412751c4cdfba904dd94983ffe0fbc28b1735f098377c752e115f2e7",
    "0002_keyed_schedule_reverse.sql": "27b740599d853ff460fb0efe56a8dee0455fdaa3d7503dfb56960d27dfa81a44",
    "0003_keyed_plan.sql": "1b6681c91ce4a71ba977adee6cb3fadce1ea79f81b94f7b68d4054517f868de5",
    "0004_debounce_plan.sql": "38206217d6a2d23b45dd417fc87d3f97b5e1a0bb6062a37837d2c9e4f0d07863",
}


def test_the_state_numbers_are_the_public_ones():
    assert {s.name: s.value for s in Status} == {
        "PENDING": 0, "DISPATCHED": 1, "DONE": 2, "CANCELLED": 3, "RUNNING": 4, "DEAD": 5}


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda p: str(p.relative_to(SQL_DIR)))
def test_no_status_is_compared_with_a_bare_number(path):
    text = path.read_text()
    found = [m.group(0) for pattern in BARE_STATUS_NUMBER for m in pattern.finditer(text)]
    assert not found, f"{path.name}: write the states as :PENDING, :DONE, ...: {found}"


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda p: str(p.relative_to(SQL_DIR)))
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
    from timeouts.store import queries

    sources = _package_sources(exclude={"queries.py"})
    unused = [name for name in queries.QUERIES
              if not any(re.search(rf"[\"']{name}[\"']", text) for text in sources.values())]
    assert not unused, f"named queries no code runs: {unused}"
    # The sets of queries.py's rules name real queries.
    assert queries.PREPARED <= set(queries.QUERIES) and queries.ON_PARTITION <= set(queries.QUERIES)


def test_a_query_that_names_its_partition_runs_only_on_one_of_timeouts_own():
    from timeouts.store import queries

    assert queries.NAMING_A_PARTITION == {"move_parked_rows", "start_calls_ahead"}
    text = queries.on_partition("move_parked_rows", "timeouts_task_d20260101")
    assert "INSERT INTO timeouts_task_d20260101\n" in text and queries.PARTITION_SLOT not in text
    text = queries.on_partition("start_calls_ahead", "timeouts_task_d20260101")
    assert "UPDATE timeouts_task_d20260101 AS timeouts_task\n" in text and queries.PARTITION_SLOT not in text
    for name in ("timeouts_task_d20260101; DROP TABLE timeouts_task", "public.timeouts_task_d20260101", "pg_class"):
        with pytest.raises(ValueError, match="cannot run on partition"):
            queries.on_partition("move_parked_rows", name)
    with pytest.raises(ValueError, match="cannot run on partition"):
        queries.on_partition("find_task", "timeouts_task_d20260101")  # a query that names none


def test_every_named_query_says_what_it_does():
    from timeouts.store import queries

    # The line right under each header, one line, then the SQL or a bare `--` before more comment.
    missing = [name for name, text in queries.QUERIES.items() if queries.description(text) is None]
    assert not missing, f"named queries without a one-line description under their header: {missing}"
    missing = [name for name, text in queries.PARTS.items() if queries.description(text) is None]
    assert not missing, f"SQL parts without a one-line description under their header: {missing}"
    assert all(text.endswith(".") for text in queries.DESCRIPTIONS.values())
    # Unique: a query's first line tells its statements apart in captured SQL (test_batches).
    assert len(set(queries.DESCRIPTIONS.values())) == len(queries.DESCRIPTIONS)


def test_a_description_is_one_line():
    from timeouts.store.queries import description

    assert description("-- Counts them.\nSELECT 1;") == "Counts them."
    assert description("-- Counts them.\n--\n-- Why, at length.\nSELECT 1;") == "Counts them."
    assert description("-- Counts them, and this sentence\n-- goes on.\nSELECT 1;") is None
    assert description("SELECT 1;") is None
    assert description("--\n-- Counts them.\nSELECT 1;") is None


def test_a_part_is_taken_in_where_a_query_names_it():
    from timeouts.store.queries import include, parse, sections

    text = "-- name: a\n-- Runs.\nSELECT x FROM (\n    {inner}\n) AS s;\n\n-- part: inner\n-- Inner.\nSELECT 1\nAS x\n"
    parts = sections(text, "part")
    assert parts == {"inner": "-- Inner.\nSELECT 1\nAS x"}
    expanded = "-- Runs.\nSELECT x FROM (\n    -- Inner.\n    SELECT 1\n    AS x\n) AS s;"
    assert include(sections(text)["a"], parts) == expanded
    assert parse(text) == {"a": expanded}  # a file on its own: with the parts it defines
    assert parse("-- name: b\n-- Runs.\n{inner};", parts) == {"b": "-- Runs.\n-- Inner.\nSELECT 1\nAS x;"}
    with pytest.raises(ValueError, match="unknown SQL part"):
        include("{other},", parts)


def test_shared_sql_is_written_once():
    from timeouts.store import queries

    # The biz_types walk is one part, read by the claim and by the dispatcher's deadline; the claim's
    # two rounds take their tasks through one part.
    written = queries.sections(
        (QUERY_SQL_DIR / "claims.sql").read_text() + (QUERY_SQL_DIR / "dispatcher.sql").read_text())
    for name in ("claim_due", "claimable_deadline"):
        assert written[name].count("{pending_types}") == 1, name
    assert written["claim_due"].count("{oldest_due_tasks}") == 2
    assert "FOR UPDATE SKIP LOCKED" not in written["claim_due"]  # the tasks are locked in the part alone
    # The bounds of a limit and the token bucket's arithmetic are the migration's functions alone.
    for name in ("claim_due", "claimable_deadline"):
        assert not re.search(r"86400|1e6|1000000|/ 20\b", queries.QUERIES[name]), name


def test_every_sql_file_is_read_once():
    from timeouts.store import queries

    # sql/queries holds the runtime query files, each read by queries.py; sql/migrations holds the
    # migrations' files, each named by exactly one migration. Nothing else lies in either.
    assert {path.parent for path in SQL_FILES} == {QUERY_SQL_DIR, MIGRATION_SQL_DIR}
    runtime = {path.name for path in SQL_FILES if path.parent == QUERY_SQL_DIR}
    assert runtime == set(queries.QUERY_FILES), f"sql/queries holds {sorted(runtime)}, QUERY_FILES names others"
    migrations = {path.name: text for path, text in _package_sources().items() if path.parent.name == "migrations"}
    for path in SQL_FILES:
        if path.parent != MIGRATION_SQL_DIR:
            continue
        users = [name for name, text in migrations.items() if re.search(rf"[\"']{re.escape(path.name)}[\"']", text)]
        assert len(users) == 1, f"{path.name} is used by {users or 'no migration'}: each by exactly one"
