"""The canonical Celery wiring for a host project using timeouts."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def add_timeouts_beat_entries(sender, **kwargs):
    import timeouts.celery

    sender.conf.beat_schedule.update(timeouts.celery.beat_schedule())
