"""The Celery worker's side: running an attempt, keeping its lease, batches, on-time work first."""
