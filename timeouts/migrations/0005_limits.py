"""Business isolation (sql/0005_limits.sql): the table of the biz_types' limits and pauses, and the
(biz_type, run_at) index of PENDING tasks that fair claiming walks. The table is read and written
through timeouts.isolation (no model); the permission to change limits from the admin is the task
model's."""

from django.db import migrations

from timeouts.migrations import run_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0004_task_results")]

    operations = [
        run_sql_file("0005_limits.sql", reverse="0005_limits_reverse.sql"),
        migrations.AlterModelOptions(
            name="timeouttask",
            options={
                "verbose_name": "timeout task",
                "permissions": [
                    ("cancel_timeouttask", "Can cancel timeout tasks and run them now"),
                    ("requeue_timeouttask", "Can requeue dead or cancelled timeout tasks"),
                    ("change_limits", "Can pause, resume and change the limits of a biz type"),
                ],
            },
        ),
    ]
