"""The Celery app of the demo project: Celery's Django recipe, plus timeouts' one line."""

import os

from celery import Celery

import timeouts.celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
timeouts.celery.setup(app)
app.autodiscover_tasks()
