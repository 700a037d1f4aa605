"""Django's tasks framework: `django.tasks` (Django 6.0+), else the `django-tasks` backport
(`django_tasks`) on Django 5.2. The two differ in the names of two exceptions only.

Without either, importing this module raises an ImportError that says which extra to install."""

import django

# The distribution's name and its extra (pyproject.toml), as a user types them.
INSTALL_TASKS = 'pip install "django-timeouts[tasks]"'
MISSING_TASKS = (
    f"timeouts.backends needs Django's tasks framework: Django 6.0 has it built in, Django "
    f"{django.get_version()} needs its backport, django-tasks. Install it with: {INSTALL_TASKS}"
)

try:
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:  # Django < 6.0: the backport
    try:
        import django_tasks  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "django_tasks":
            raise
        raise ImportError(MISSING_TASKS, name="django_tasks") from exc
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

__all__ = ["BaseTaskBackend", "InvalidTask", "TaskContext", "TaskError", "TaskResult", "TaskResultDoesNotExist",
           "TaskResultStatus", "normalize_json", "task_backends", "task_enqueued", "task_finished", "task_started"]
