"""The test settings with a result backend (the test broker's Redis database), task events, and the
Celery signals of tests/testapp's tasks recorded (timeouts_test_celery_signal): for the tests of
what a Celery user sees of each call's run."""

from tests.settings_results import *  # noqa: F403

CELERY_WORKER_SEND_TASK_EVENTS = True
TIMEOUTS_TEST_RECORD_SIGNALS = True
