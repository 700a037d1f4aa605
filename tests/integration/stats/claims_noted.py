"""What the health tests share: the claimers' notes (timeouts_last_claims) emptied, or written as if
a claimer had claimed some time ago; the command run in this process."""

import io

from django.core.management import call_command
from django.db import connections


def run(*args):
    """(exit status, stdout, stderr) of `manage.py timeouts_health *args`."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("timeouts_health", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        return exc.code, out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def forget_claims(aliases=("default",)):
    """timeouts_last_claims has no model, so Django's flush between tests leaves its rows: empty it."""
    for alias in aliases:
        with connections[alias].cursor() as cursor:
            cursor.execute("TRUNCATE timeouts_last_claims")


def claimed(ago=0.0, claimer="scan", alias="default"):
    """As if a `claimer` had claimed on `alias` `ago` seconds ago (by the database clock)."""
    with connections[alias].cursor() as cursor:
        cursor.execute("INSERT INTO timeouts_last_claims (claimer, claimed_at, process) "
                       "VALUES (%s, now() - %s * interval '1 second', 'test-host:1') "
                       "ON CONFLICT (claimer) DO UPDATE SET claimed_at = excluded.claimed_at", [claimer, ago])


def noted(alias="default") -> dict:
    """claimer -> (claimed_at, process) of the notes on `alias`."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT claimer, claimed_at, process FROM timeouts_last_claims")
        return {claimer: (claimed_at, process) for claimer, claimed_at, process in cursor.fetchall()}
