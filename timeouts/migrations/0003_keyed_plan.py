"""timeouts_waiting_for_key_v2 (sql/migrations/0003_keyed_plan.sql) finds a key's waiting tasks by
the key's own index whatever plan PL/pgSQL keeps, also one made before the first ANALYZE.

Unapplied, it leaves the function as it is: the same signature and meaning as 0002 made it, with
plans that cannot go wrong, so nothing needs undoing (unapplying 0002 drops it)."""

from django.db import migrations

from timeouts.migrations import read_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0002_keyed_schedule")]

    operations = [
        migrations.RunSQL(read_sql_file("0003_keyed_plan.sql"), migrations.RunSQL.noop),
    ]
