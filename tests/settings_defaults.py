"""The test settings with Django's and Celery's database defaults, as a new host project has them:
CONN_MAX_AGE 0, no health checks, no prepared statements, no CELERY_DB_REUSE_MAX."""

import os

import dj_database_url

from tests.settings import *  # noqa: F403

DATABASES = {"default": {**dj_database_url.parse(os.environ["DATABASE_URL"]), "TEST": DATABASES["default"]["TEST"]}}  # noqa: F405
del CELERY_DB_REUSE_MAX  # noqa: F821
