"""The partitioned task table. The database side is SQL (sql/0001_schema.sql): Django cannot express
a partitioned table whose key includes the partition column while the model's primary key is job_id.
The state side is the plain model Django and its admin work with."""

from django.db import migrations, models

from timeouts.migrations import run_sql_file


def create_first_partitions(apps, schema_editor):
    from timeouts import partitions

    partitions.maintain(using=schema_editor.connection.alias)


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[run_sql_file("0001_schema.sql", reverse="0001_schema_reverse.sql")],
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
                        'permissions': [('cancel_timeouttask', 'Can cancel timeout tasks and run them now'), ('requeue_timeouttask', 'Can requeue dead or cancelled timeout tasks')],
                    },
                ),
            ],
        ),
        migrations.RunPython(create_first_partitions, migrations.RunPython.noop),
    ]
