"""Django settings of the system-under-test processes the reliability scenarios start (workers,
dispatchers, scan loops): the test settings, plus a Redis visibility timeout from the environment
(TIMEOUTS_TEST_VISIBILITY_TIMEOUT, seconds), so a scenario can see Redis redeliver the unacknowledged
messages of a worker that died within seconds instead of kombu's default hour (kombu then looks for
them every second)."""

import os

from tests.settings import *  # noqa: F403

_visibility_timeout = os.environ.get("TIMEOUTS_TEST_VISIBILITY_TIMEOUT")
if _visibility_timeout and CELERY_BROKER_URL.startswith("redis"):  # noqa: F405
    CELERY_BROKER_TRANSPORT_OPTIONS = {**CELERY_BROKER_TRANSPORT_OPTIONS,  # noqa: F405
                                       "visibility_timeout": float(_visibility_timeout),
                                       "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
