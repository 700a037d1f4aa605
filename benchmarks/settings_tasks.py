"""The demo project's settings with Django's tasks framework served by timeouts, for the tasks_*
scenarios of the bench (their worker, dispatcher and enqueuing process)."""

from project.settings import *  # noqa: F403

try:
    import django.tasks  # noqa: F401  (Django 6.0+)
except ImportError:  # Django 5.2: the backport is an app
    INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks"]  # noqa: F405

TASKS = {"default": {"BACKEND": "timeouts.backends.TimeoutsBackend", "QUEUES": ["default"],
                     "OPTIONS": {"MAX_ATTEMPTS": 1}}}
