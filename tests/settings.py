"""The demo project's settings plus a test app whose handlers record every start."""

import os

from project.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]  # noqa: F405
CELERY_BROKER_URL = os.environ.get("TIMEOUTS_TEST_BROKER_URL", "redis://127.0.0.1:6379/13")
CELERY_BROKER_TRANSPORT_OPTIONS = broker_transport_options(CELERY_BROKER_URL)  # noqa: F405
CELERY_WORKER_TIMER_PRECISION = worker_timer_precision(CELERY_BROKER_URL)  # noqa: F405
# Celery lets the CELERY_BROKER_URL environment variable override the setting (bin/test exports the
# project's broker there): pin it to the test broker for this process and every child it starts.
os.environ["CELERY_BROKER_URL"] = CELERY_BROKER_URL
# Django's tasks framework on timeouts (tests/*/test_tasks_backend*.py): "default" with Django's
# semantics (one attempt), "retrying" with three attempts and a short TTR (a lost attempt shows soon).
TASKS = {
    "default": {"BACKEND": "timeouts.backends.TimeoutsBackend", "QUEUES": ["default", "timeouts-test-other"]},
    "retrying": {"BACKEND": "timeouts.backends.TimeoutsBackend", "QUEUES": ["default"],
                 "OPTIONS": {"MAX_ATTEMPTS": 3, "TTR": 3}},
    # The conformance suite's (tests/testapp/conformance.py): the lease and attempts of its handler.
    "conformance": {"BACKEND": "timeouts.backends.TimeoutsBackend", "QUEUES": ["default"],
                    "OPTIONS": {"MAX_ATTEMPTS": 2, "TTR": 3}},
}
# Two more databases for the shard tests (tests/*/test_shards*.py): on the test server, unless
# TIMEOUTS_TEST_SHARD_B_URL / ..._C_URL point elsewhere (a process a test starts on the test
# databases). They are created only for a run that collects a test asking for them. TIMEOUTS["SHARDS"]
# names them only where a test says so, or in a process started with TIMEOUTS_TEST_SHARDS.
SHARD_ALIASES = ("shard_b", "shard_c")
for _alias in SHARD_ALIASES:
    _url = os.environ.get(f"TIMEOUTS_TEST_{_alias.upper()}_URL")
    _where = {key: value for key, value in dj_database_url.parse(_url).items()  # noqa: F405
              if key in ("NAME", "USER", "PASSWORD", "HOST", "PORT")} if _url else {}
    DATABASES[_alias] = {**DATABASES["default"], **_where,  # noqa: F405
                         "TEST": {"NAME": f"{DATABASES['default']['TEST']['NAME']}_{_alias}"}}  # noqa: F405
# Django's advice for test suites: a fast hasher, since the tests create and log in users all the time
# and the default one is slow on purpose.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Django's backend, with a cheaper flush between transactional tests (tests/postgresql/base.py).
for _database in DATABASES.values():  # noqa: F405
    _database["ENGINE"] = "tests.postgresql"
if os.environ.get("TIMEOUTS_TEST_SHARDS"):
    TIMEOUTS = {**TIMEOUTS, "SHARDS": os.environ["TIMEOUTS_TEST_SHARDS"].split(",")}  # noqa: F405
LOGGING["loggers"]["timeouts"]["level"] = os.environ.get("TIMEOUTS_LOG_LEVEL", "WARNING")  # noqa: F405
