"""A task of Django's tasks framework, run by timeouts.backends.TimeoutsBackend."""

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task
def order_total(order_id, amounts):
    return {"order": order_id, "total": sum(amounts)}
