"""The trace context each task was scheduled in (sql/migrations/0003_trace_context.sql), for
tracing with OpenTelemetry: SQL only. The model does not declare the column: only timeouts' own
statements read it (the claim and the worker's start), so the admin and the ORM never fetch it."""

from django.db import migrations

from timeouts.migrations import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0002_last_claims")]

    operations = [
        run_sql_file("0003_trace_context.sql", reverse="0003_trace_context_reverse.sql"),
    ]
