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
        # And the queues of Django's tasks framework that timeouts.backends.TimeoutsBackend serves.
        from timeouts.backends.queues import register_from_settings

        register_from_settings()
        # Imported for what importing does: the system checks register themselves, the Celery tasks
        # join the host's app, the dispatcher thread starts in workers when DISPATCHER_IN_WORKER is on,
        # workers hand tasks claimed on time to their pool first, and a pool process Celery kills
        # cannot leave its worker's main process stuck.
        from timeouts import checks, tasks  # noqa: F401
        from timeouts.dispatch import in_worker  # noqa: F401
        from timeouts.worker import pool_process_exit, priority  # noqa: F401

        priority.install()
        pool_process_exit.install()
