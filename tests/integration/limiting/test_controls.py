"""timeouts.limits(), set_limits(), reset_limits(), pause(), resume(), and the handlers' own limits:
what is stored, what is in force, and the typed errors for bad values (which store nothing)."""

import math

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction

import timeouts
from tests.support.isolation import no_limits  # noqa: F401  (a fixture)
from timeouts import registry
from timeouts.backends import queues as tasks_queues
from timeouts.durable.calls import biz_type_for
from timeouts.limiting import controls

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60), pytest.mark.usefixtures("no_limits")]


@pytest.fixture
def limited_handler():
    """A handler that declares both limits, forgotten afterwards."""
    timeouts.handler("test.limited", rate_limit=2.5, concurrency=3)(lambda task: None)
    yield "test.limited"
    registry.unregister("test.limited")


def stored():
    with connection.cursor() as cursor:
        cursor.execute("SELECT biz_type, declared_rate_limit, declared_concurrency, overridden, rate_limit, "
                       "concurrency, paused FROM timeouts_limits ORDER BY biz_type")
        return cursor.fetchall()


def test_a_handler_without_limits_has_none_in_force():
    assert timeouts.limits("test.record") == timeouts.Limits(rate_limit=None, concurrency=None, paused=False)
    assert stored() == []


def test_a_handlers_own_limits_are_in_force_before_and_after_they_are_declared(limited_handler):
    assert timeouts.limits(limited_handler) == timeouts.Limits(2.5, 3, False)
    assert controls.declare() >= 1
    assert (limited_handler, 2.5, 3, False, None, None, False) in stored()
    assert controls.declare() == 0  # nothing changed: nothing written
    assert timeouts.limits(limited_handler) == timeouts.Limits(2.5, 3, False)


def test_set_limits_overrides_the_handlers_own_until_reset(limited_handler):
    controls.declare()
    timeouts.set_limits(limited_handler, rate_limit=10, concurrency=None)
    assert timeouts.limits(limited_handler) == timeouts.Limits(10.0, None, False)
    controls.declare()  # a deploy declaring the handler's values again changes nothing in force
    assert timeouts.limits(limited_handler) == timeouts.Limits(10.0, None, False)
    timeouts.set_limits(limited_handler)  # no limit at all
    assert timeouts.limits(limited_handler) == timeouts.Limits(None, None, False)
    timeouts.reset_limits(limited_handler)
    assert timeouts.limits(limited_handler) == timeouts.Limits(2.5, 3, False)


def test_pause_and_resume_keep_the_limits():
    timeouts.set_limits("test.record", concurrency=4)
    timeouts.pause("test.record")
    timeouts.pause("test.record")  # pausing twice is harmless
    assert timeouts.limits("test.record") == timeouts.Limits(None, 4, True)
    timeouts.resume("test.record")
    assert timeouts.limits("test.record") == timeouts.Limits(None, 4, False)


def test_a_pause_inside_a_rolled_back_transaction_never_happened():
    with transaction.atomic():
        timeouts.pause("test.record")
        assert timeouts.limits("test.record").paused
        transaction.set_rollback(True)
    assert not timeouts.limits("test.record").paused


def test_the_limits_of_a_stored_celery_call_may_be_set_without_its_app_loaded():
    timeouts.set_limits("celery:proj.tasks.charge", rate_limit=0.5)
    assert timeouts.limits("celery:proj.tasks.charge") == timeouts.Limits(0.5, None, False)


# ... and fewer than one start a day, more than a million a second
BAD_RATES = [0, -1, -0.5, math.nan, math.inf, -math.inf, True, "10", 10j,
             1e-13, 1 / 86400 * 0.99, 1_000_001, 1e300, 10**400]
BAD_CONCURRENCIES = [0, -3, 1.5, math.nan, True, "2", 1_000_001, 2**31, 2**63]


@pytest.mark.parametrize("rate_limit", BAD_RATES, ids=repr)
def test_a_bad_rate_limit_is_refused_and_stores_nothing(rate_limit):
    with pytest.raises(timeouts.InvalidOption, match="rate_limit"):
        timeouts.set_limits("test.record", rate_limit=rate_limit)
    assert stored() == []


@pytest.mark.parametrize("concurrency", BAD_CONCURRENCIES, ids=repr)
def test_a_bad_concurrency_is_refused_and_stores_nothing(concurrency):
    with pytest.raises(timeouts.InvalidOption, match="concurrency"):
        timeouts.set_limits("test.record", concurrency=concurrency)
    assert stored() == []


def test_the_bounds_of_a_limit_are_accepted():
    timeouts.set_limits("test.record", rate_limit=1 / 86400, concurrency=1_000_000)
    assert timeouts.limits("test.record") == timeouts.Limits(1 / 86400, 1_000_000, False)
    timeouts.set_limits("test.record", rate_limit=1_000_000, concurrency=1)
    assert timeouts.limits("test.record") == timeouts.Limits(1_000_000.0, 1, False)


def test_a_limit_out_of_bounds_says_which_bounds():
    with pytest.raises(timeouts.InvalidOption, match="one start a day .* a million a second.*got 1e-13"):
        timeouts.set_limits("test.record", rate_limit=1e-13)
    with pytest.raises(timeouts.InvalidOption, match="at most 1000000, got 2147483648"):
        timeouts.set_limits("test.record", concurrency=2**31)


@pytest.mark.parametrize("call", ["limits", "pause", "resume", "set_limits", "reset_limits"])
def test_an_unknown_or_invalid_biz_type_is_refused_and_stores_nothing(call):
    with pytest.raises(timeouts.UnknownBizType, match="no.such"):
        getattr(timeouts, call)("no.such")
    with pytest.raises(timeouts.InvalidBizType):
        getattr(timeouts, call)("not a biz type")
    with pytest.raises(timeouts.InvalidBizType):
        getattr(timeouts, call)(None)
    assert stored() == []


@pytest.mark.parametrize("biz_type", [biz_type_for("tests.not_bound_here"),
                                      tasks_queues.biz_type_for("elsewhere", "default")])
def test_the_kinds_without_a_handler_of_their_own_are_known(biz_type):
    """The rule cancel() follows too (registry.check_known)."""
    assert timeouts.limits(biz_type) == timeouts.Limits()


@pytest.mark.parametrize("options", [{"rate_limit": 0}, {"rate_limit": math.nan}, {"rate_limit": math.inf},
                                     {"rate_limit": "5"}, {"rate_limit": 1e-13}, {"rate_limit": 2e6},
                                     {"concurrency": 0}, {"concurrency": 2.0}, {"concurrency": False},
                                     {"concurrency": 2**31}], ids=repr)
def test_a_handler_declaring_a_bad_limit_is_misconfigured(options):
    with pytest.raises(ImproperlyConfigured, match="test.misconfigured"):
        timeouts.handler("test.misconfigured", **options)
    assert registry.find_handler("test.misconfigured") is None


def test_the_table_refuses_values_the_api_refuses():
    """The CHECK constraints hold the same rules for a row written by hand."""
    from django.db import IntegrityError

    for column, value in [("rate_limit", 0), ("rate_limit", "NaN"), ("rate_limit", "Infinity"),
                          ("concurrency", 0), ("declared_rate_limit", -1), ("declared_concurrency", 0)]:
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO timeouts_limits (biz_type, overridden, {column}) VALUES ('x', true, %s)",
                           [value])
