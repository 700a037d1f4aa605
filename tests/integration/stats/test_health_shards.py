"""`manage.py timeouts_health` over three shards (three test databases): each shard is checked on its
own, a shard that is down or does not answer is reported within the timeout while the others are
still checked, and the liveness probe does not fail for a shard it cannot read."""

import re
import socket
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections

import timeouts
from tests.integration.stats.claims_noted import claimed, forget_claims, run
from tests.support.shards import ALIASES, key_on, three_shards, unreachable  # noqa: F401 (an autouse fixture)

pytestmark = [pytest.mark.django_db(transaction=True, databases=ALIASES), pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def no_claims_noted(transactional_db):
    forget_claims(ALIASES)
    yield
    forget_claims(ALIASES)


def late_on(alias, minutes=5):
    return timeouts.schedule("test.record", key_on(alias, "late"), at=datetime.now(UTC) - timedelta(minutes=minutes))


@contextmanager
def silent_server(alias):
    """The shard's connections go to a server that accepts them and never says a word (a hung
    server, or one behind a link that drops every reply)."""
    server = socket.create_server(("127.0.0.1", 0))
    settings_dict = connections[alias].settings_dict
    connections[alias].close()
    saved = settings_dict["HOST"], settings_dict["PORT"]
    settings_dict["HOST"], settings_dict["PORT"] = "127.0.0.1", server.getsockname()[1]
    try:
        yield
    finally:
        settings_dict["HOST"], settings_dict["PORT"] = saved
        server.close()


def test_each_shard_is_checked_on_its_own():
    late = late_on("shard_c")
    for alias in ALIASES:
        claimed(alias=alias)
    code, out, err = run()
    assert (code, out) == (1, "")
    assert re.fullmatch(rf"shard_c: tasks wait too long: the oldest due task, job {late.job_id} "
                        r"\(test.record:late-\d+\), has waited 5 min \d+ s, more than 60.00 s; 1 task due\n", err), err
    code, out, err = run("--database", "default")
    assert (code, err) == (0, "")
    assert out.startswith("OK: 1 shard read; no task due; last claim")
    late.cancel()
    code, out, _ = run()
    assert code == 0 and out.startswith("OK: 3 shards read; no task due; last claim on each shard at most ")


def test_a_shard_that_is_down_is_reported_and_the_others_still_checked():
    late_on("shard_c")
    for alias in ALIASES:
        claimed(alias=alias)
    with unreachable("shard_b"):
        code, out, err = run()
    assert (code, out) == (1, "")
    down, late = err.splitlines()
    assert down.startswith("shard_b: cannot read the database 'shard_b': ")
    assert late.startswith("shard_c: tasks wait too long")


def test_a_shard_that_does_not_answer_is_reported_within_the_timeout():
    with silent_server("shard_b"):
        code, out, err = run("--timeout", "1")
    assert (code, out) == (1, "")
    assert err == "shard_b: cannot read the database 'shard_b': no answer within 1 s\n"


def test_the_liveness_probe_does_not_fail_for_a_shard_it_cannot_read():
    claimed(alias="default")
    claimed(alias="shard_c")
    with unreachable("shard_b"):
        code, out, err = run("--liveness")
        assert (code, err) == (0, "")
        assert out.startswith("OK: 2 of 3 shards read; shard_b unread, not a failure of this probe (")
        code, _, err = run("--readiness")
        assert code == 1 and err.startswith("shard_b: cannot read the database 'shard_b': ")
