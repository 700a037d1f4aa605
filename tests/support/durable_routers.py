"""A host's Celery task router in the test process, where the scan and a dispatcher thread publish
stored calls: one that fails, as a router that reads a database or a service can."""

from contextlib import contextmanager

from celery import current_app


class FailingFirst:
    """A router that raises `error` for the first `times` calls it routes, then routes them as
    the app would (None: the next router decides)."""

    def __init__(self, error, times=1):
        self.error, self.times, self.failed = error, times, 0

    def __call__(self, name, args, kwargs, options, task=None, **rest):
        if self.failed < self.times:
            self.failed += 1
            raise self.error
        return None


@contextmanager
def routed_by(router):
    """`router` first among the app's task routers, as the first entry of CELERY_TASK_ROUTES."""
    live = current_app.amqp.router
    before = live.routes
    live.routes = [router, *before]
    try:
        yield router
    finally:
        live.routes = before
