"""The function behind schedule(..., on_conflict="debounce") (sql/migrations/0005_debounce.sql): SQL
only, no model."""

from django.db import migrations

from timeouts.migrations import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0004_lateness")]

    operations = [
        run_sql_file("0005_debounce.sql", reverse="0005_debounce_reverse.sql"),
    ]
