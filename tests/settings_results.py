"""The test settings with a result backend (the test broker's Redis database), for the tests of
tasks whose results are kept."""

from tests.settings import *  # noqa: F403

CELERY_RESULT_BACKEND = CELERY_BROKER_URL  # noqa: F405
