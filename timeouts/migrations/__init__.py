from pathlib import Path

from django.db import migrations

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"


def run_sql_file(name, *, reverse):
    """A migration step that runs one SQL file of timeouts/sql (each file is used exactly once)."""
    return migrations.RunSQL((SQL_DIR / name).read_text(), (SQL_DIR / reverse).read_text())
