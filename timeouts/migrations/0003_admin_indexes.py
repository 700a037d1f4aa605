"""Indexes for the admin's filters and ordering (sql/0003_admin_indexes.sql)."""

from django.db import migrations

from timeouts.migrations import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0002_notify")]

    operations = [run_sql_file("0003_admin_indexes.sql", reverse="0003_admin_indexes_reverse.sql")]
