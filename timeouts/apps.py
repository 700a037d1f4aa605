from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class TimeoutsConfig(AppConfig):
    name = "timeouts"
    verbose_name = "Timeouts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # The kinds of work of timeouts' extensions (timeouts.registry), which register themselves as
        # they load: before the project's handlers, which may not take their biz_types.
        from timeouts.backends import queues  # noqa: F401
        from timeouts.durable import calls  # noqa: F401

        # Handlers registered in every process that loads Django: web (validation of biz_type),
        # scanner and dispatcher (routing to queues) and workers (running them).
        autodiscover_modules("timeouts_handlers")
        # And the queues of Django's tasks framework that timeouts.backends.TimeoutsBackend serves.
        from timeouts.backends.queues import register_from_settings

        register_from_settings()
        # Each piece is installed by name, here: ready() runs in every process that loads Django, and in
        # a Celery worker before its first signal (Celery's Django fixup loads Django before
        # `worker_init`). Connected on import instead, a piece would be live or not depending on
        # which modules other imports happened to load.
        from timeouts import checks, metrics
        from timeouts.dispatch import in_worker
        from timeouts.durable import starts
        from timeouts.worker import leases, pool_process_exit, priority

        checks.register_checks()  # manage.py check, runserver, migrate...
        metrics.connect()  # the Prometheus counters count timeouts.events' events
        in_worker.connect()  # the dispatcher thread, in workers when DISPATCHER_IN_WORKER is on
        leases.install()  # a worker's processes know whether their pool stops a handler at its time limit
        priority.install()  # workers hand the tasks claimed on time to their pool first
        pool_process_exit.install()  # a pool process Celery kills cannot leave its worker stuck
        starts.install()  # a worker gives back the DurableTask calls it started ahead and then dropped
        # The one import kept for what importing does: Celery's shared tasks (timeouts.run, run_batch,
        # scan, maintain) are declared by defining them, and join every Celery app from then on. The
        # host's autodiscover_tasks() would import the module too, but only in processes that call it.
        from timeouts import tasks  # noqa: F401
