"""timeouts.testing: the package's one name, and the arguments run_due() refuses before it reads or
writes anything (no database here: a refusal cannot have touched one)."""

from datetime import datetime

import pytest

import timeouts.testing
from timeouts import InvalidBizType, InvalidTime, TimeoutsError, UnknownBizType
from timeouts.testing import run_due

pytestmark = pytest.mark.timeout(30)


def test_run_due_is_the_packages_public_name():
    from timeouts.testing.in_process import run_due as defined

    assert timeouts.testing.__all__ == ["run_due"]
    assert run_due is defined
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        timeouts.testing.missing  # noqa: B018


@pytest.mark.parametrize("until", [datetime(2030, 1, 1), "2030-01-01T00:00:00+00:00", 1893456000, 0.0])
def test_until_must_be_an_aware_datetime(until):
    with pytest.raises(InvalidTime, match="until must be"):
        run_due(until=until)


def test_biz_type_must_be_one_that_a_handler_or_kind_knows():
    with pytest.raises(InvalidBizType):
        run_due(biz_type="not a biz_type")
    with pytest.raises(InvalidBizType):
        run_due(biz_type=42)
    with pytest.raises(UnknownBizType, match="no.such.handler"):
        run_due(biz_type="no.such.handler")
    assert issubclass(UnknownBizType, TimeoutsError)


def test_its_arguments_are_keywords_it_knows():
    with pytest.raises(TypeError, match="run_due"):
        run_due(datetime(2030, 1, 1))
    with pytest.raises(TypeError, match="run_due"):
        run_due(untill=None)
