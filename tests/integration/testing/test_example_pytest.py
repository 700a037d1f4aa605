"""The pytest example of docs/howto/testing.md, which includes this file from its first import:
the demo's order.close handler (project/orders), tested with run_due() and pytest-django's `db`."""

from datetime import timedelta

from django.utils import timezone

import timeouts
from project.orders.models import Order
from timeouts.testing import run_due


def test_an_unpaid_order_closes_after_30_minutes(db):
    order = Order.objects.create()
    timeouts.schedule("order.close", order.pk, delay=timedelta(minutes=30))

    assert run_due() == 0  # not due yet
    assert run_due(until=timezone.now() + timedelta(minutes=31)) == 1

    order.refresh_from_db()
    assert order.status == Order.Status.CLOSED
