"""The demo project as a new host would first run it: Django's database defaults (CONN_MAX_AGE 0,
no health checks, no prepared statements) and Celery's (no CELERY_DB_REUSE_MAX), wired only by
timeouts.celery.setup(app). The `defaults` scenario runs its worker and dispatcher with these settings
beside the same processes with the project's tuned ones."""

import os

import dj_database_url

from project.settings import *  # noqa: F403

DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"])}
del CELERY_DB_REUSE_MAX  # noqa: F821
