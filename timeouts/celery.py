"""Celery wiring for host projects: `app.conf.beat_schedule.update(timeouts.celery.beat_schedule())`."""

from .conf import get_settings

MAINTAIN_INTERVAL = 60.0  # seconds; partitions are created days ahead, leases are also recovered by scans


def beat_schedule() -> dict:
    settings = get_settings()
    return {
        "timeouts.scan": {
            "task": "timeouts.scan",
            "schedule": settings.SCAN_INTERVAL,
            # A scan that waited a whole interval in the queue is superseded by the next one.
            "options": {"expires": settings.SCAN_INTERVAL},
        },
        "timeouts.maintain": {
            "task": "timeouts.maintain",
            "schedule": MAINTAIN_INTERVAL,
            "options": {"expires": MAINTAIN_INTERVAL},
        },
    }
