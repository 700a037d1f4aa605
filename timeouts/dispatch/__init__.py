"""Finding due tasks and handing them to Celery: the claim, the dispatcher, the scan, publishing."""
