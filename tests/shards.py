"""What the shard tests share: the three test databases as shards (tests/settings.py), a biz_id
that lives on a given shard, and a shard made unreachable."""

import itertools

from django.db import connections

from tests.processes import free_port
from timeouts import own_connection, shards

ALIASES = ["default", "shard_b", "shard_c"]


def use_three_shards(settings):
    """`settings`: pytest-django's fixture, which puts the setting back after the test."""
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": ALIASES}


def key_on(alias, prefix="key", biz_type="test.record"):
    """A biz_id whose tasks of `biz_type` live on `alias`."""
    return next(biz_id for biz_id in (f"{prefix}-{n}" for n in itertools.count())
                if shards.place(biz_type, biz_id).alias == alias)


class unreachable:
    """A shard whose server does not answer: its connections point at a port nothing listens on."""

    def __init__(self, alias):
        self.alias = alias

    def __enter__(self):
        connection = connections[self.alias]
        connection.close()
        self.port = connection.settings_dict["PORT"]
        connection.settings_dict["PORT"] = free_port()
        own_connection.close()

    def __exit__(self, *exc):
        connections[self.alias].close()
        connections[self.alias].settings_dict["PORT"] = self.port
        own_connection.close()
