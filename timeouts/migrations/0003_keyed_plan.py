"""timeouts_waiting_for_key_v2 (sql/migrations/0003_keyed_plan.sql) reads a key's first waiting
task by the key's index whatever the statistics, also in a plan kept from before the first ANALYZE."""

from django.db import migrations

from timeouts.migrations import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0002_keyed_schedule")]

    operations = [
        run_sql_file("0003_keyed_plan.sql", reverse="0003_keyed_plan_reverse.sql"),
    ]
