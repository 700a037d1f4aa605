"""A backend for Django's tasks framework (`django.tasks` on Django 6.0+, the `django-tasks`
backport on 5.2) whose tasks are timeout tasks:

    TASKS = {"default": {"BACKEND": "timeouts.backends.TimeoutsBackend", "QUEUES": ["default"],
                         "OPTIONS": {"MAX_ATTEMPTS": 1}}}

See docs/howto/django-tasks.md.
"""

from timeouts.backends.backend import TimeoutsBackend
from timeouts.backends.cancelling import cancel
from timeouts.backends.errors import Cancelled, InvalidTaskArguments, InvalidTaskOptions, LeaseExpired

__all__ = ["Cancelled", "InvalidTaskArguments", "InvalidTaskOptions", "LeaseExpired", "TimeoutsBackend", "cancel"]
