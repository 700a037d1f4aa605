"""What the shard tests share: the three test databases as shards (tests/settings.py; import
`three_shards` into a test module), a biz_id
that lives on a given shard, and a shard made unreachable."""

import itertools

import pytest
from django.db import connections

from tests.support.isolation import forget_limits
from tests.support.processes import free_port
from timeouts.storage import shards
from timeouts.store import worker_connection

ALIASES = ["default", "shard_b", "shard_c"]


@pytest.fixture(autouse=True)
def three_shards(settings):
    """The three test databases as TIMEOUTS["SHARDS"], in every test of a module that imports this
    (autouse: in force before a worker fixture hands the settings to its process), with no limit
    or pause stored on any of them before or after: timeouts_limits has no model, so Django's flush
    leaves it, and a pause left on a shard would hold its tasks in later tests."""
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": ALIASES}
    forget_limits(ALIASES)
    yield
    forget_limits(ALIASES)


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
        worker_connection.close()

    def __exit__(self, *exc):
        connections[self.alias].close()
        connections[self.alias].settings_dict["PORT"] = self.port
        worker_connection.close()
