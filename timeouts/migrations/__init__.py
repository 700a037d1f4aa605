from pathlib import Path

from django.db import migrations

from timeouts.states import substitute

SQL_DIR = Path(__file__).resolve().parent.parent / "sql" / "migrations"


def read_sql_file(name) -> str:
    """The text of one SQL file of timeouts/sql/migrations, with the task states (`:PENDING`, ...) as numbers."""
    return substitute((SQL_DIR / name).read_text())


def run_sql_file(name, *, reverse):
    """A migration step that runs one SQL file of timeouts/sql/migrations (each file is used exactly once)."""
    return migrations.RunSQL(read_sql_file(name), read_sql_file(reverse))
