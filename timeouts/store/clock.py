"""The database's clock: every due time, lateness and lease is read against it, never a process's."""

from django.db import connections

from timeouts.store.queries import fetch_one


def database_now(using="default"):
    return fetch_one("database_now", using=connections[using])["now"]
