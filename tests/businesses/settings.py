"""The test settings with a small shop's handlers (timeouts_handlers.py) in place of the test app's,
for the browser test of the businesses page: the page shows the shop's biz_types and the demo's
order.close, and nothing else."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "tests.testapp"] + ["tests.businesses"]  # noqa: F405
del TASKS  # noqa: F821  (the tasks framework's queues are biz_types too)
