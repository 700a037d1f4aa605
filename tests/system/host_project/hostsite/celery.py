import os

from celery import Celery

import timeouts.celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostsite.settings")
app = Celery("hostsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
timeouts.celery.setup(app)
app.autodiscover_tasks()
