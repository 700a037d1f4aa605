"""A backend for Django's tasks framework (`django.tasks` on Django 6.0+, the `django-tasks`
backport on 5.2) whose tasks are timeout tasks:

    TASKS = {"default": {"BACKEND": "timeouts.backends.TimeoutsBackend", "QUEUES": ["default"],
                         "OPTIONS": {"MAX_ATTEMPTS": 1}}}

See docs/howto/django-tasks.md.

Every project that installs timeouts imports this package (apps.py reads the TASKS setting through
timeouts.backends.queues), whether or not it uses the framework. So on Django 5.2 without the
backport the package itself still imports; its names raise the ImportError that says
`pip install "django-timeouts[tasks]"` (timeouts.backends.compat) when something asks for them.
"""

__all__ = ["Cancelled", "InvalidTaskArguments", "InvalidTaskOptions", "LeaseExpired", "StartedLate", "TimeoutsBackend",
           "cancel"]

try:
    from timeouts.backends.backend import TimeoutsBackend
    from timeouts.backends.cancelling import cancel
    from timeouts.backends.errors import Cancelled, InvalidTaskArguments, InvalidTaskOptions, LeaseExpired, StartedLate
except ImportError as exc:
    if exc.name != "django_tasks":
        raise
    _missing = exc

    def __getattr__(name):
        if name in __all__:
            raise ImportError(str(_missing), name="django_tasks") from _missing
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
