"""A minimal host project that knows nothing of this repository but the installed `timeouts` app."""

import os
from datetime import timedelta

SECRET_KEY = "host-project-test"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "timeouts", "shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["HOST_DB_NAME"],
        "USER": "postgres",
        "HOST": os.environ.get("HOST_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("HOST_DB_PORT", "5432"),
    }
}
TIMEOUTS = {"PARTITION_INTERVAL": "hour", "PARTITIONS_AHEAD": 3, "RETENTION": timedelta(days=1)}
TASKS = {"default": {"BACKEND": "timeouts.backends.TimeoutsBackend", "QUEUES": ["default"],
                     "OPTIONS": {"MAX_ATTEMPTS": 1}}}
CELERY_BROKER_URL = "memory://"
CELERY_TASK_ALWAYS_EAGER = True  # handlers run inline: this host only checks the API surface
