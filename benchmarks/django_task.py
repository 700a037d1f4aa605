"""The bench's task for Django's tasks framework: the same recording as the timeouts handler and
the Celery tasks of benchmarks.handlers, one row per start.

Enqueued through the backend of `benchmarks.settings_tasks` (`timeouts.backends.TimeoutsBackend`)
by the tasks_* scenarios; the django-tasks-db peer runs the same body in its own harness.
"""

try:
    from django.tasks import task  # Django 6.0+
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

from .handlers import record


@task()
def record_start(key, action_time):
    record(key, 1, action_time)
