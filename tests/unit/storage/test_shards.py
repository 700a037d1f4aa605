"""Where a task lives among several databases: the slot of a biz_id, the slots of each shard, the
job_id that names its shard, SHARD_ROUTER, and the SHARDS setting's validation."""

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from timeouts.conf import get_settings
from timeouts.storage import shards
from timeouts.store.queries import QUERIES

pytestmark = pytest.mark.timeout(30)

THREE = {"SHARDS": ["default", "shard_b", "shard_c"]}


def route_to_shard_c(biz_type, biz_id):
    return "shard_c"


def route_nowhere(biz_type, biz_id):
    return "elsewhere"


def test_the_slot_of_a_biz_id_is_fixed_for_ever():
    # A changed hash would strand every task stored before it: these values must never change.
    assert [shards.slot_of(biz_id) for biz_id in ("42", "order-1", "", "é")] == [744, 425, 217, 407]


def test_one_shard_holds_every_slot_and_changes_nothing():
    assert shards.aliases() == ("default",)
    assert shards.slots_of("default") == range(0, 1024)
    assert shards.place("test.record", "42") == shards.Place("default", 744)


@pytest.mark.parametrize("count", [1, 2, 3, 5, 7, 1024])
def test_the_shards_hold_contiguous_runs_of_slots_that_cover_them_all(count):
    held = [slot for index in range(count) for slot in shards.slot_range(index, count)]
    assert held == list(range(shards.SLOTS))
    for index in range(count):
        assert {shards.shard_index(slot, count) for slot in shards.slot_range(index, count)} == {index}


@override_settings(TIMEOUTS=THREE)
def test_three_shards_split_the_slots_in_thirds():
    assert [shards.slots_of(alias) for alias in THREE["SHARDS"]] == [range(0, 342), range(342, 683), range(683, 1024)]
    assert shards.place("test.record", "order-1") == shards.Place("shard_b", 425)
    assert shards.place("test.record", "42") == shards.Place("shard_c", 744)


@override_settings(TIMEOUTS=THREE)
def test_a_job_id_names_its_shard():
    for biz_id in ("42", "order-1", "7", "x"):
        place = shards.place("test.record", biz_id)
        job_id = 123_456 * shards.SLOTS + place.slot  # as insert_task makes it
        assert shards.alias_of_job(job_id) == place.alias


@override_settings(TIMEOUTS={**THREE, "SHARD_ROUTER": f"{__name__}.route_to_shard_c"})
def test_the_router_picks_the_shard_and_the_hash_one_of_its_slots():
    for biz_id in ("42", "order-1", "7"):
        place = shards.place("test.record", biz_id)
        assert place.alias == "shard_c" and place.slot in shards.slots_of("shard_c")
        assert shards.alias_of_job(10 * shards.SLOTS + place.slot) == "shard_c"
    # What is not a business key of the host's goes by the hash alone.
    assert shards.hashed("order-1") == shards.Place("shard_b", 425)


@override_settings(TIMEOUTS={**THREE, "SHARD_ROUTER": f"{__name__}.route_nowhere"})
def test_a_router_that_names_no_shard_is_a_configuration_error():
    with pytest.raises(ImproperlyConfigured, match="'elsewhere', which is not in TIMEOUTS"):
        shards.place("test.record", "42")


@override_settings(TIMEOUTS=THREE)
def test_a_caller_that_chose_its_shard_keeps_it():
    assert shards.place("test.record", "42", "default").alias == "default"
    assert shards.place("test.record", "42", "default").slot in shards.slots_of("default")


@pytest.mark.parametrize(("value", "message"), [
    ([], "SHARDS must be a non-empty list"),
    ("default", "SHARDS must be a non-empty list"),
    (["default", "nope"], "'nope' is not a database alias"),
    (["default", "default"], "SHARDS must name each alias once"),
])
def test_bad_shards_are_refused(value, message):
    with override_settings(TIMEOUTS={"SHARDS": value}), pytest.raises(ImproperlyConfigured, match=message):
        get_settings()


def test_a_router_must_be_a_dotted_path():
    with override_settings(TIMEOUTS={"SHARD_ROUTER": "route"}), pytest.raises(ImproperlyConfigured,
                                                                             match="SHARD_ROUTER must be"):
        get_settings()


def test_the_insert_puts_the_slot_in_the_low_bits_of_the_job_id():
    assert f"nextval('timeouts_task_job_id_seq') * {shards.SLOTS} + %(slot)s" in QUERIES["insert_task"]
