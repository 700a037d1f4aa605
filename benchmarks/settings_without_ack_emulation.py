"""The demo project's settings with kombu's Redis acknowledgement emulation off, as a worker that
takes only timeouts' messages and DurableTask calls may run (docs: howto/deploy). Run the bench with
`--settings benchmarks.settings_without_ack_emulation` to measure such a worker beside the default
one."""

from project.settings import *  # noqa: F403

CELERY_BROKER_TRANSPORT_OPTIONS = {**CELERY_BROKER_TRANSPORT_OPTIONS, "ack_emulation": False}  # noqa: F405
