"""The demo's timeout handler: an order still unpaid when its timeout fires is closed.

Handlers run at least once, so this one is idempotent: the conditional UPDATE closes an open,
unpaid order and does nothing to one already paid or closed.
"""

import logging

import timeouts

from .models import Order

logger = logging.getLogger("timeouts.demo")


@timeouts.handler("order.close")
def close_order(task):
    closed = Order.objects.filter(pk=task.biz_id, paid=False, status=Order.Status.OPEN).update(
        status=Order.Status.CLOSED
    )
    logger.info(
        "order.close: order #%s %s, %.3f s after its action_time",
        task.biz_id, "closed" if closed else "left alone (paid or already closed)", task.lateness.total_seconds(),
    )
