from django.db import migrations

from timeouts.migrations import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0001_initial")]

    operations = [run_sql_file("0002_notify.sql", reverse="0002_notify_reverse.sql")]
