"""The function behind schedule(..., on_conflict="debounce") (sql/migrations/0003_debounce.sql): SQL
only, no model."""

from django.db import migrations

from timeouts.migrations import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0002_last_claims")]

    operations = [
        run_sql_file("0003_debounce.sql", reverse="0003_debounce_reverse.sql"),
    ]
