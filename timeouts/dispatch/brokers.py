"""What kind of broker a Celery broker URL names: the settings timeouts applies to the app
(celery.py), its checks (checks.py) and the priorities of its messages (publishing.py) differ
between RabbitMQ and Redis."""


def _scheme(url) -> str:
    """The transport without its driver (`amqp+ssl` -> `amqp`); RabbitMQ, Celery's default, if unset."""
    return str(url or "amqp://").split("://", 1)[0].split("+", 1)[0]


def is_amqp(url) -> bool:
    """RabbitMQ (Celery's default broker when none is set)."""
    return _scheme(url) in ("amqp", "amqps", "pyamqp")


def is_redis(url) -> bool:
    return _scheme(url) in ("redis", "rediss", "sentinel")
