"""Settings of the demo/test host project. Services come from the environment:

DATABASE_URL       default postgres://postgres@127.0.0.1:5432/timeouts
CELERY_BROKER_URL  default redis://127.0.0.1:6379/0
"""

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-demo-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "timeouts",
    "project.orders",
    "benchmarks",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = "project.wsgi.application"

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/timeouts"),
        conn_max_age=600,
        conn_health_checks=True,
    )
}
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("TIMEOUTS_TEST_DB", "test_timeouts")}
# Django turns psycopg's prepared statements off (for connection poolers); this lets timeouts
# prepare its few hot-path queries (schedule(), the claim, the worker's start and outcome). Django's
# own client-side cursors never prepare, so nothing else changes. Leave it out behind a pooler that
# cannot keep prepared statements (PgBouncer before 1.21 in transaction mode).
DATABASES["default"]["OPTIONS"] = {**DATABASES["default"].get("OPTIONS", {}), "prepare_threshold": 5}

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TIMEOUTS = {
    "PARTITION_INTERVAL": os.environ.get("TIMEOUTS_PARTITION_INTERVAL", "day"),
    "RETENTION": timedelta(days=7),
    "SCAN_INTERVAL": float(os.environ.get("TIMEOUTS_SCAN_INTERVAL", "5")),
    "MAX_DISPATCHED": int(os.environ.get("TIMEOUTS_MAX_DISPATCHED", "1000")),
}
# More shards, for processes that a benchmark starts on several databases:
# TIMEOUTS_SHARD_URLS="alias=url,alias=url" adds each alias with the default's options, and makes
# the shards "default" followed by them. Without it, "default" is the only shard.
_SHARD_URLS = [item.split("=", 1) for item in os.environ.get("TIMEOUTS_SHARD_URLS", "").split(",") if item]
for _alias, _url in _SHARD_URLS:
    _where = {key: value for key, value in dj_database_url.parse(_url).items()
              if key in ("NAME", "USER", "PASSWORD", "HOST", "PORT")}
    DATABASES[_alias] = {**{key: value for key, value in DATABASES["default"].items() if key != "TEST"}, **_where}
if _SHARD_URLS:
    TIMEOUTS["SHARDS"] = ["default", *(alias for alias, _ in _SHARD_URLS)]

# Celery: timeouts.celery.setup(app) in project/celery.py applies what timeouts relies on (JSON, one
# message prefetched per process, the beat entries); these are the project's own choices.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Handlers that use the ORM keep their connection across tasks (timeouts.W004); CONN_MAX_AGE and
# CONN_HEALTH_CHECKS above then decide when to replace it. Timeouts' own statements do not need it.
CELERY_DB_REUSE_MAX = 1000


def broker_transport_options(url):
    """kombu's filesystem:// fallback (no Redis here) needs its folders; RabbitMQ gets publisher confirms."""
    if url.startswith("filesystem://"):
        folder = Path(os.environ.get("TIMEOUTS_BROKER_FOLDER") or BASE_DIR / "var" / "broker")
        return {"data_folder_in": str(folder / "queue"), "data_folder_out": str(folder / "queue"),
                "control_folder": str(folder / "control"), "processed_folder": str(folder / "processed"),
                "polling_interval": 0.05}
    return {"confirm_publish": True}


CELERY_BROKER_TRANSPORT_OPTIONS = broker_transport_options(CELERY_BROKER_URL)


def worker_timer_precision(url):
    """filesystem:// cannot wake Celery's event loop, so ETA messages wait on a timer thread that
    sleeps this long at a time (Celery's default, 1 s, would make every timeout up to a second late)."""
    return 0.05 if url.startswith("filesystem://") else 1.0


CELERY_WORKER_TIMER_PRECISION = worker_timer_precision(CELERY_BROKER_URL)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"timeouts": {"handlers": ["console"], "level": os.environ.get("TIMEOUTS_LOG_LEVEL", "INFO")}},
}
