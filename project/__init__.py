# The Celery app is loaded with Django so that shared tasks bind to it (Celery's Django recipe).
from .celery import app as celery_app

__all__ = ["celery_app"]
