"""The test settings, for a process (a worker, a dispatcher) whose spans a test reads: OpenTelemetry's
SDK records them into the folder TIMEOUTS_TEST_SPANS_DIR names (exporting.py). Configured here
because a settings module is what every process of the project imports first, before a prefork
worker forks its pool."""

import os

from tests.settings import *  # noqa: F403
from tests.tracing import exporting

exporting.export_to_files(os.environ[exporting.SPANS_DIR])
