"""A small shop's handlers, for the browser test of the businesses page (settings.py), each with
the limits such a handler would declare."""

import timeouts


@timeouts.handler("coupon.expire", concurrency=50)
def expire_coupon(task):
    pass


@timeouts.handler("webhook.retry", rate_limit=20, concurrency=5)
def retry_webhook(task):
    pass


@timeouts.handler("email.send", rate_limit=100)
def send_email(task):
    pass
