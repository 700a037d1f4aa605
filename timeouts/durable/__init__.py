"""DurableTask: Celery calls whose eta/countdown waits in timeouts' table."""
