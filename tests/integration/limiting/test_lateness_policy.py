"""The lateness policy beside the limits: a handler's own (declared as its limits are), set_limits()'
override of it, what timeouts.limits() says is in force, and the typed errors for bad values (which
store nothing)."""

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction

import timeouts
from tests.support.isolation import no_limits  # noqa: F401  (a fixture)
from timeouts import registry
from timeouts.limiting import controls

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60), pytest.mark.usefixtures("no_limits")]

FIVE_MINUTES = timedelta(minutes=5)


@pytest.fixture
def late_handler():
    """A handler that declares limits and a policy, forgotten afterwards."""
    timeouts.handler("test.late", rate_limit=2.5, concurrency=3, max_lateness=FIVE_MINUTES, on_late="skip")(
        lambda task: None)
    yield "test.late"
    registry.unregister("test.late")


def stored():
    with connection.cursor() as cursor:
        cursor.execute("SELECT biz_type, declared_max_lateness, declared_on_late, lateness_overridden, max_lateness, "
                       "on_late FROM timeouts_limits ORDER BY biz_type")
        return cursor.fetchall()


def test_no_policy_is_in_force_by_default():
    assert timeouts.limits("test.record") == timeouts.Limits(None, None, False, None, "run")
    assert timeouts.limits("test.record") == timeouts.Limits(None, None, False)


def test_a_handlers_own_policy_is_in_force_before_and_after_it_is_declared(late_handler):
    own = timeouts.Limits(2.5, 3, False, FIVE_MINUTES, "skip")
    assert timeouts.limits(late_handler) == own
    assert controls.declare() >= 1
    assert (late_handler, FIVE_MINUTES, "skip", False, None, None) in stored()
    assert controls.declare() == 0  # nothing changed: nothing written
    assert timeouts.limits(late_handler) == own


def test_the_policy_alone_is_overridden_and_the_limits_stay(late_handler):
    controls.declare()
    timeouts.set_limits(late_handler, max_lateness=timedelta(seconds=30), on_late="dead")
    assert timeouts.limits(late_handler) == timeouts.Limits(2.5, 3, False, timedelta(seconds=30), "dead")
    timeouts.set_limits(late_handler, max_lateness=timedelta(seconds=10))  # on_late not given: "run"
    assert timeouts.limits(late_handler) == timeouts.Limits(2.5, 3, False, timedelta(seconds=10), "run")
    timeouts.set_limits(late_handler, max_lateness=None)  # no limit on lateness: as if none were declared
    assert timeouts.limits(late_handler) == timeouts.Limits(2.5, 3, False, None, "run")
    controls.declare()  # a deploy declaring the handler's values again changes nothing in force
    assert timeouts.limits(late_handler) == timeouts.Limits(2.5, 3, False, None, "run")


def test_the_limits_alone_are_overridden_and_the_policy_stays(late_handler):
    timeouts.set_limits(late_handler, rate_limit=10)
    assert timeouts.limits(late_handler) == timeouts.Limits(10.0, None, False, FIVE_MINUTES, "skip")
    timeouts.set_limits(late_handler)  # no limit at all, the policy as it was
    assert timeouts.limits(late_handler) == timeouts.Limits(None, None, False, FIVE_MINUTES, "skip")


def test_both_in_one_call_and_reset_restores_both(late_handler):
    timeouts.set_limits(late_handler, rate_limit=1, concurrency=None, max_lateness=timedelta(hours=1), on_late="dead")
    timeouts.pause(late_handler)
    assert timeouts.limits(late_handler) == timeouts.Limits(1.0, None, True, timedelta(hours=1), "dead")
    timeouts.reset_limits(late_handler)
    assert timeouts.limits(late_handler) == timeouts.Limits(2.5, 3, True, FIVE_MINUTES, "skip")


def test_a_pause_of_a_biz_type_not_declared_yet_keeps_its_handlers_policy(late_handler):
    timeouts.pause(late_handler)  # the first row of the biz_type: the start reads the policy from it
    assert timeouts.limits(late_handler) == timeouts.Limits(2.5, 3, True, FIVE_MINUTES, "skip")


def test_a_policy_set_inside_a_rolled_back_transaction_never_was():
    with transaction.atomic():
        timeouts.set_limits("test.record", rate_limit=5, max_lateness=FIVE_MINUTES, on_late="skip")
        transaction.set_rollback(True)
    assert timeouts.limits("test.record") == timeouts.Limits()


@pytest.mark.parametrize("options, message", [
    ({"max_lateness": timedelta(0)}, "max_lateness must be a positive timedelta"),
    ({"max_lateness": -timedelta(seconds=1), "on_late": "skip"}, "max_lateness must be a positive timedelta"),
    ({"max_lateness": 300}, "max_lateness must be a positive timedelta or None .*, got 300"),
    ({"max_lateness": "PT5M", "on_late": "dead"}, "max_lateness must be a positive timedelta"),
    ({"max_lateness": FIVE_MINUTES, "on_late": "later"}, "on_late must be 'run', 'skip' or 'dead', got 'later'"),
    ({"max_lateness": FIVE_MINUTES, "on_late": None}, "on_late must be 'run', 'skip' or 'dead', got None"),
    ({"on_late": "skip"}, "on_late='skip' needs a max_lateness"),
    ({"rate_limit": 5, "on_late": "dead"}, "on_late='dead' needs a max_lateness"),
    ({"rate_limit": -5, "max_lateness": FIVE_MINUTES}, "rate_limit must be None or a number"),
])
def test_a_bad_policy_is_refused_and_stores_nothing(options, message):
    with pytest.raises(timeouts.InvalidOption, match=message):
        timeouts.set_limits("test.record", **options)
    assert stored() == []


def test_the_table_refuses_a_policy_written_by_hand_past_the_rules():
    controls.set_limits("test.record", max_lateness=FIVE_MINUTES, on_late="skip")
    for change in ("on_late = 'drop'", "max_lateness = NULL", "max_lateness = interval '-1 second'",
                   "declared_on_late = 'dead'", "lateness_overridden = false"):
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"UPDATE timeouts_limits SET {change}")
