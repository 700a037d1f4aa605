"""timeouts' schema. The database side is SQL (sql/migrations/0001_*.sql): Django cannot express a
partitioned table whose key includes the partition column while the model's primary key is job_id.
The state side is the plain model Django and its admin work with. Besides the model's columns, the
task table holds some that only timeouts' own statements read (a Django task's result, the trace
context), so the admin and the ORM never fetch them; the other tables have no model.

- 0001_tasks.sql: the partitioned task table, its DEFAULT partition and its indexes;
- 0001_notify.sql: the function that wakes the dispatchers;
- 0001_debounce.sql: the function behind schedule(..., on_conflict="debounce");
- 0001_keyed_schedule.sql: the function behind schedule()'s other on_conflict modes in one statement;
- 0001_limits.sql: the biz_types' limits, pauses and lateness policies (timeouts_limits, read and
  written through timeouts.limiting), the index fair claiming walks and each shard's part of a
  limit. The permission to change limits from the admin is the task model's;
- 0001_last_claims.sql: each kind of claimer's last claim, which the health check reads.

The first partitions are created last, when the tables and their indexes are complete."""

from django.db import migrations, models

from timeouts.migrations import run_sql_file


def create_first_partitions(apps, schema_editor):
    from timeouts.storage import partitions

    partitions.maintain(using=schema_editor.connection.alias)


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[run_sql_file("0001_tasks.sql", reverse="0001_tasks_reverse.sql")],
            state_operations=[
                migrations.CreateModel(
                    name='TimeoutTask',
                    fields=[
                        ('job_id', models.BigAutoField(primary_key=True, serialize=False)),
                        ('biz_type', models.CharField(max_length=64)),
                        ('biz_id', models.CharField(max_length=255)),
                        ('status', models.SmallIntegerField(choices=[(0, 'pending'), (1, 'dispatched'), (2, 'done'), (3, 'cancelled'), (4, 'running'), (5, 'dead')], default=0)),
                        ('action_time', models.DateTimeField(help_text='When the task becomes due (UTC).')),
                        ('run_at', models.DateTimeField(help_text='When the next attempt may start: action_time, or later after a retry.')),
                        ('attribute', models.JSONField(blank=True, default=dict)),
                        ('attempts', models.IntegerField(default=0)),
                        ('max_attempts', models.IntegerField()),
                        ('ttr', models.IntegerField(help_text='Seconds a claimed or running task may go silent before it is re-dispatched.')),
                        ('last_error', models.TextField(blank=True, default='')),
                        ('lease_until', models.DateTimeField(blank=True, null=True)),
                        ('created_at', models.DateTimeField()),
                        ('modified_at', models.DateTimeField()),
                        ('dispatched_at', models.DateTimeField(blank=True, null=True)),
                        ('started_at', models.DateTimeField(blank=True, null=True)),
                        ('finished_at', models.DateTimeField(blank=True, null=True)),
                    ],
                    options={
                        'verbose_name': 'timeout task',
                        'db_table': 'timeouts_task',
                        'permissions': [('cancel_timeouttask', 'Can cancel timeout tasks and run them now'), ('requeue_timeouttask', 'Can requeue dead or cancelled timeout tasks'), ('change_limits', 'Can pause, resume and change the limits of a biz type')],
                    },
                ),
            ],
        ),
        run_sql_file("0001_notify.sql", reverse="0001_notify_reverse.sql"),
        run_sql_file("0001_debounce.sql", reverse="0001_debounce_reverse.sql"),
        run_sql_file("0001_keyed_schedule.sql", reverse="0001_keyed_schedule_reverse.sql"),
        run_sql_file("0001_limits.sql", reverse="0001_limits_reverse.sql"),
        run_sql_file("0001_last_claims.sql", reverse="0001_last_claims_reverse.sql"),
        migrations.RunPython(create_first_partitions, migrations.RunPython.noop),
    ]
