"""The limits in force, as columns of timeouts_limits (sql/0007_limits_in_force.sql)."""

from django.db import migrations

from timeouts.migrations import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0006_limit_shares")]

    operations = [run_sql_file("0007_limits_in_force.sql", reverse="0007_limits_in_force_reverse.sql")]
