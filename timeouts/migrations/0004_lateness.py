"""The lateness policy of biz_types (sql/migrations/0004_lateness.sql): columns of timeouts_limits,
which has no model, so Django's state does not change."""

from django.db import migrations

from timeouts.migrations import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0003_trace_context")]

    operations = [run_sql_file("0004_lateness.sql", reverse="0004_lateness_reverse.sql")]
