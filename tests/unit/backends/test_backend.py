"""TimeoutsBackend's pure parts, without services: result ids, the biz_type and Celery queue of
each queue name, and the backend's settings."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ImproperlyConfigured

from timeouts.backends import queues
from timeouts.backends.compat import TaskResultDoesNotExist
from timeouts.backends.results import parse_result_id, result_id
from timeouts.registry import BIZ_TYPE_RE


@pytest.mark.parametrize("action_time", [
    datetime(2026, 11, 25, 19, 4, 18, 123456, tzinfo=UTC), datetime(1970, 1, 1, tzinfo=UTC),
    datetime(1969, 7, 20, 20, 17, 40, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
])
def test_a_result_id_is_the_rows_key_to_the_microsecond(action_time):
    text = result_id(123, action_time)
    assert parse_result_id(text) == {"job_id": 123, "action_time": action_time}


def test_a_result_id_holds_an_aware_datetime_in_any_zone():
    moment = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    local = moment.astimezone(ZoneInfo("Europe/Berlin"))
    assert result_id(1, local) == result_id(1, moment)


@pytest.mark.parametrize("bad", ["", "12", "a-b", "1-2-3", "1.5-2", None, "99-" + "9" * 40, f"{2**63}-1", "0-1",
                                 "-5-1"])
def test_what_is_no_result_id_does_not_exist(bad):
    with pytest.raises(TaskResultDoesNotExist, match="not a result id"):
        parse_result_id(bad)


@pytest.mark.parametrize(("alias", "queue"), [
    ("default", "default"), ("default", "emails.high"), ("a" * 40, "b" * 40), ("default", "emails/high priority"),
    ("dé", "q"),
])
def test_every_alias_and_queue_has_a_valid_biz_type_of_its_own(alias, queue):
    biz_type = queues.biz_type_for(alias, queue)
    assert BIZ_TYPE_RE.fullmatch(biz_type) and biz_type.startswith("tasks:")
    assert biz_type != queues.biz_type_for(alias, queue + "x")


def test_the_default_queue_runs_on_celerys_default_queue():
    assert queues.celery_queue("default") is None
    assert queues.celery_queue("emails") == "emails"


def test_options_default_to_djangos_single_attempt():
    options = queues.options("default", {"BACKEND": queues.BACKEND})
    assert (options.queues, options.max_attempts, options.ttr) == (("default",), 1, 60)
    options = queues.options("x", {"QUEUES": ["a", "b", "a"], "OPTIONS": {"MAX_ATTEMPTS": 5, "TTR": 10}})
    assert (options.queues, options.max_attempts, options.ttr) == (("a", "b"), 5, 10)


@pytest.mark.parametrize("params", [
    {"QUEUES": []}, {"QUEUES": "default"}, {"QUEUES": [""]}, {"OPTIONS": {"MAX_ATTEMPTS": 0}},
    {"OPTIONS": {"MAX_ATTEMPTS": True}}, {"OPTIONS": {"TTR": 1.5}}, {"OPTIONS": {"PRIORITY": 1}},
])
def test_bad_settings_say_what_is_wrong(params):
    with pytest.raises(ImproperlyConfigured, match=r"TASKS\['default'\]"):
        queues.options("default", params)


def test_distinct_keys_have_distinct_ids():
    now = datetime.now(UTC)
    ids = {result_id(job_id, now + timedelta(microseconds=us)) for job_id in range(50) for us in range(50)}
    assert len(ids) == 2500
