"""The TestCase example of docs/howto/testing.md, which includes this file from its first import:
the demo's order.close handler (project/orders), tested with run_due()."""

from datetime import timedelta

from django.test import TestCase
from django.utils import timezone

import timeouts
from project.orders.models import Order
from timeouts.testing import run_due


class OrderTimeoutTests(TestCase):
    def test_an_unpaid_order_closes_after_30_minutes(self):
        order = Order.objects.create()
        timeouts.schedule("order.close", order.pk, delay=timedelta(minutes=30))

        self.assertEqual(run_due(), 0)  # not due yet
        self.assertEqual(run_due(until=timezone.now() + timedelta(minutes=31)), 1)

        order.refresh_from_db()
        self.assertEqual(order.status, Order.Status.CLOSED)

    def test_paying_cancels_the_timeout(self):
        order = Order.objects.create()
        timeouts.schedule("order.close", order.pk, delay=timedelta(minutes=30))

        Order.objects.filter(pk=order.pk).update(paid=True, status=Order.Status.PAID)
        timeouts.cancel("order.close", order.pk)

        self.assertEqual(run_due(until=timezone.now() + timedelta(days=1)), 0)
        order.refresh_from_db()
        self.assertEqual(order.status, Order.Status.PAID)
