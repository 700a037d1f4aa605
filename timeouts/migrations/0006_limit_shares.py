"""Limits across shards (sql/0006_limit_shares.sql): each shard's part of a biz_type's limits,
in timeouts_limits (no model)."""

from django.db import migrations

from timeouts.migrations import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0005_limits")]

    operations = [run_sql_file("0006_limit_shares.sql", reverse="0006_limit_shares_reverse.sql")]
