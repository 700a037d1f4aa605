"""Django's PostgreSQL backend, as the test suite uses it: the same in every way but one.

Between transactional tests (TransactionTestCase, pytest-django's `transactional_db`) Django
empties every table of every database the test used, with one TRUNCATE. TRUNCATE gives each table,
and each partition of timeouts_task, new files, a cost paid after every such test on each of its
databases; DELETE of the few rows a test leaves costs next to nothing. The tables end empty either
way. Django's foreign keys on PostgreSQL are DEFERRABLE INITIALLY DEFERRED, so within the flush's
transaction the order of the DELETEs does not matter. A flush that resets sequences or cascades is
left to TRUNCATE.
"""

from django.db.backends.postgresql import base


class DatabaseOperations(base.DatabaseOperations):
    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade:
            return super().sql_flush(style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return [f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(table))};" for table in tables]


class DatabaseWrapper(base.DatabaseWrapper):
    ops_class = DatabaseOperations
