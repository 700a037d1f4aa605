"""The result columns of Django's tasks framework's tasks (sql/0004_task_results.sql): database only,
the model does not declare them."""

from django.db import migrations

from timeouts.migrations import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0003_admin_indexes")]

    operations = [run_sql_file("0004_task_results.sql", reverse="0004_task_results_reverse.sql")]
