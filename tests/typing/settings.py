"""The settings the type check's Django plugin loads (tests/typing/mypy.ini): a host with timeouts
installed. Nothing connects to the database."""

SECRET_KEY = "only-type-checked"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.messages",
    "django.contrib.sessions",
    "timeouts",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "typed"}}
USE_TZ = True
