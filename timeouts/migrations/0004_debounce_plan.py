"""timeouts_debounce_v1 (sql/migrations/0004_debounce_plan.sql) finds a key's PENDING task by the
key's own index whatever plan PL/pgSQL keeps, also one made before the first ANALYZE.

Unapplied, it leaves the function as it is: the same signature and meaning as 0001 made it, with a
plan that cannot go wrong, so nothing needs undoing (unapplying 0001 drops it)."""

from django.db import migrations

from timeouts.migrations import read_sql_file


class Migration(migrations.Migration):
    dependencies = [("timeouts", "0003_keyed_plan")]

    operations = [
        migrations.RunSQL(read_sql_file("0004_debounce_plan.sql"), migrations.RunSQL.noop),
    ]
