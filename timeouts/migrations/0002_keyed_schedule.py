"""timeouts_waiting_for_key_v2 (sql/migrations/0002_keyed_schedule.sql), which schedule_keyed calls
instead of v1: it finds a key's waiting tasks by the key's index, whatever the number of tasks of
its biz_type."""

from django.db import migrations

from timeouts.migrations import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0001_initial")]

    operations = [
        run_sql_file("0002_keyed_schedule.sql", reverse="0002_keyed_schedule_reverse.sql"),
    ]
