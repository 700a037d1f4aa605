"""Settings of the system-under-test processes of the scenarios with stored Celery calls: the
reliability settings, plus the oracle's DurableTask (tests/reliability/durable_calls.py)."""

from tests.reliability.settings import *  # noqa: F403

CELERY_IMPORTS = ("tests.reliability.durable_tasks",)
