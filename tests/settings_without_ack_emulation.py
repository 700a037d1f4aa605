"""The test settings with kombu's Redis acknowledgement emulation off (docs: howto/deploy): for the
workers of the tests that check such a worker loses nothing."""

from tests.settings import *  # noqa: F403

CELERY_BROKER_TRANSPORT_OPTIONS = {**CELERY_BROKER_TRANSPORT_OPTIONS, "ack_emulation": False}  # noqa: F405
