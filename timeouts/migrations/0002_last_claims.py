"""The record of each kind of claimer's last claim (sql/migrations/0002_last_claims.sql), which the
health check reads: SQL only, no model."""

from django.db import migrations

from timeouts.migrations import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0001_initial")]

    operations = [
        run_sql_file("0002_last_claims.sql", reverse="0002_last_claims_reverse.sql"),
    ]
