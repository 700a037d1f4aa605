"""Every call of retry_on_conflict() names the database its statement runs on (`using=`): a retry
inside the caller's transaction takes its savepoint there, and without it the savepoint would be
taken on `default`, whichever shard the statement runs on. Read from the source, so it needs no
database."""

import ast
from pathlib import Path

import timeouts

PACKAGE = Path(timeouts.__file__).resolve().parent


def _calls_without_using():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                    == "retry_on_conflict" and not any(keyword.arg == "using" for keyword in node.keywords)):
                yield f"{path.relative_to(PACKAGE)}:{node.lineno}"


def test_every_retry_names_its_database():
    assert list(_calls_without_using()) == []
