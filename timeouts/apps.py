from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class TimeoutsConfig(AppConfig):
    name = "timeouts"
    verbose_name = "Timeouts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Handlers registered in every process that loads Django: web (validation of biz_type),
        # scanner and dispatcher (routing to queues) and workers (running them).
        autodiscover_modules("timeouts_handlers")
        from . import checks  # noqa: F401  system checks
        from . import tasks  # noqa: F401  registers the Celery tasks with the host's app
        from . import worker_dispatcher  # noqa: F401  the dispatcher thread, when DISPATCHER_IN_WORKER is on
