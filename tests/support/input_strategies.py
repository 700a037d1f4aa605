"""Hypothesis strategies for the arguments of schedule(), bulk_schedule() and reschedule().

Each strategy yields `Arg`s: a value plus what the API says of it (`error`: None for valid input,
else the TimeoutsError subclass the API names). Valid and invalid values come from the same
strategies, so every property test sees both, and the edges of every limit.
"""

import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from decimal import Decimal
from zoneinfo import ZoneInfo

from hypothesis import strategies as st

from timeouts import (
    InvalidAttribute,
    InvalidBizId,
    InvalidBizType,
    InvalidOption,
    InvalidTime,
    TimeoutsError,
    UnknownBizType,
)
from timeouts.conf import get_settings

MAX_BYTES = get_settings().MAX_ATTRIBUTE_BYTES
MAX_DEPTH = 64  # README: "at most 64 levels deep"
YEAR = timedelta(days=365)
HANDLERS = ("test.record", "test.fail")  # registered by tests/testapp


@dataclass(frozen=True)
class Arg:
    value: object
    error: type | None = None
    label: str = ""  # a short name for values too large or too deep to print

    def __repr__(self):
        shown = self.label or _short_repr(self.value)
        return f"{shown}{'' if self.error is None else ' -> ' + self.error.__name__}"


def _short_repr(value):
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # too deep; an int of over 4300 digits
        return "<too large to repr>"
    return text if len(text) <= 300 else text[:300] + f"...({len(text)} chars)"


def ok(strategy, label=""):
    return strategy.map(lambda value: Arg(value, None, label))


def bad(error, strategy, label=""):
    return strategy.map(lambda value: Arg(value, error, label))


class Opaque:
    """A custom object: not JSON, not a str, int or UUID."""


class NoOffset(tzinfo):
    """A tzinfo whose utcoffset() is None: the datetime counts as naive."""

    def utcoffset(self, dt):
        return None


TEXT = st.characters(codec="utf-8", exclude_characters="\x00")  # codec="utf-8": no lone surrogates
SURROGATES = st.characters(categories=["Cs"])
HUGE_INT = 10**5000  # more digits than int -> str allows (sys.get_int_max_str_digits)


def _with_char(strategy_of_char):
    """Text that holds at least one character from `strategy_of_char`, anywhere."""
    return st.tuples(st.text(TEXT, max_size=5), strategy_of_char, st.text(TEXT, max_size=5)).map("".join)


VALID_BIZ_TYPES = ok(st.sampled_from(HANDLERS))
BAD_BIZ_TYPES = st.one_of(
    bad(UnknownBizType, st.from_regex(r"[A-Za-z0-9_.:-]{1,64}", fullmatch=True).filter(lambda s: s not in HANDLERS)),
    bad(InvalidBizType, st.sampled_from(["", "x" * 65, "has space", "test.record\x00", "tést", "a/b", "\ud800"])),
    bad(InvalidBizType, st.one_of(st.none(), st.integers(), st.binary(max_size=4), st.just(b"test.record"),
                                  st.just(["test.record"]), st.just({"test.record"}), st.just(Opaque()))),
    bad(InvalidBizType, st.just(HUGE_INT), "10**5000"),
)

VALID_BIZ_IDS = st.one_of(
    ok(st.text(TEXT, min_size=1, max_size=255)),
    ok(st.sampled_from(["x" * 255, "é" * 255, "𝄞" * 255, " ", "0"])),
    ok(st.integers(min_value=-(10**253), max_value=10**254)),  # at most 255 characters as str()
    ok(st.uuids()),
)
BAD_BIZ_IDS = st.one_of(
    bad(InvalidBizId, st.sampled_from(["", "x" * 256, "é" * 256, 10**255, -(10**254)])),
    bad(InvalidBizId, st.just(HUGE_INT), "10**5000"),
    bad(InvalidBizId, st.just(-HUGE_INT), "-10**5000"),
    bad(InvalidBizId, _with_char(st.just("\x00"))),
    bad(InvalidBizId, _with_char(SURROGATES)),
    bad(InvalidBizId, st.text(TEXT, min_size=256, max_size=300)),
    bad(InvalidBizId, st.one_of(st.none(), st.booleans(), st.floats(), st.binary(max_size=4), st.just(Decimal(1)),
                                st.just([1]), st.just({"id": 1}), st.just(Opaque()),
                                st.uuids().map(str).map(str.encode))),
)

BERLIN, NEW_YORK = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")
AMBIGUOUS = [  # DST: the same wall-clock time twice (fold=0, fold=1), and times that never happen
    datetime(2025, 10, 26, 2, 30, fold=0, tzinfo=BERLIN), datetime(2025, 10, 26, 2, 30, fold=1, tzinfo=BERLIN),
    datetime(2025, 11, 2, 1, 30, fold=0, tzinfo=NEW_YORK), datetime(2025, 11, 2, 1, 30, fold=1, tzinfo=NEW_YORK),
    datetime(2025, 3, 30, 2, 30, tzinfo=BERLIN), datetime(2025, 3, 9, 2, 30, fold=1, tzinfo=NEW_YORK),
]


def _aware_is_valid(at):
    # An aware datetime is valid unless its instant is outside what a datetime holds in UTC.
    try:
        at.astimezone(UTC)
    except (OverflowError, ValueError):
        return False
    return True


VALID_DELAYS = st.one_of(
    st.timedeltas(min_value=-1000 * YEAR, max_value=5000 * YEAR),
    st.integers(min_value=-(10**10), max_value=10**10),
    st.floats(min_value=-3e10, max_value=3e10, allow_nan=False),
    st.sampled_from([0, 0.0, -0.0, 1e-7, timedelta(0), timedelta(microseconds=1), -1]),
)
BAD_DELAYS = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf"), True, False, "5", Decimal(5), None, [5], b"5",
                     HUGE_INT, -HUGE_INT]),
    st.timedeltas(min_value=8100 * YEAR),
    st.timedeltas(max_value=-2100 * YEAR),  # before the year 1
    st.integers(min_value=10**12),
    st.integers(max_value=-(10**11)),
    st.floats(min_value=1e12, allow_infinity=False),
    st.floats(max_value=-1e11, allow_infinity=False),
)
BAD_ATS = st.one_of(
    st.datetimes(),  # naive
    st.datetimes().map(lambda at: at.replace(tzinfo=NoOffset())),
    st.dates(),
    st.datetimes(timezones=st.just(UTC)).map(datetime.isoformat),
    st.integers(),
    st.floats(),
    st.just(Opaque()),
)

EXTREME_ZONES = st.sampled_from([UTC, timezone(timedelta(hours=14)), timezone(timedelta(hours=23, minutes=59)),
                                 timezone(-timedelta(hours=23, minutes=59, microseconds=1))])
VALID_TIMES = st.one_of(
    ok(st.datetimes(timezones=st.timezones()).filter(_aware_is_valid).map(lambda at: {"at": at})),
    ok(st.datetimes(timezones=EXTREME_ZONES).filter(_aware_is_valid).map(lambda at: {"at": at})),
    ok(st.sampled_from(AMBIGUOUS).map(lambda at: {"at": at})),
    ok(st.sampled_from([datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)])
       .map(lambda at: {"at": at})),
    ok(VALID_DELAYS.map(lambda delay: {"delay": delay})),
)
BAD_TIMES = st.one_of(
    bad(InvalidTime, st.sampled_from([  # aware, but not representable in UTC
        datetime.max.replace(tzinfo=timezone(-timedelta(hours=1))),
        datetime.min.replace(tzinfo=timezone(timedelta(hours=1))),
        datetime(1, 1, 1, 5, tzinfo=timezone(timedelta(hours=14))),
    ]).map(lambda at: {"at": at})),
    bad(InvalidTime, BAD_DELAYS.map(lambda delay: {"delay": delay})),
    bad(InvalidTime, BAD_ATS.map(lambda at: {"at": at})),
    bad(InvalidTime, st.just({})),  # neither
    bad(InvalidTime, st.builds(lambda at, delay: {"at": at, "delay": delay},
                               st.datetimes(timezones=st.just(UTC)), VALID_DELAYS)),  # both
)

# JSON that comes back unchanged: str keys, finite numbers, no NUL, no lone surrogates.
JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                        st.text(TEXT, max_size=10), st.sampled_from([10**4000, -(10**4000), 1e300, 5e-324, 1e16]))
JSON_KEYS = st.text(TEXT, max_size=8)
JSON = st.recursive(JSON_LEAVES, lambda children: st.one_of(st.lists(children, max_size=4),
                                                            st.dictionaries(JSON_KEYS, children, max_size=4)),
                    max_leaves=12)
JSON_OBJECTS = st.dictionaries(JSON_KEYS, JSON, max_size=5)

BAD_LEAVES = st.sampled_from([
    float("nan"), float("inf"), float("-inf"), "a\x00b", "\x00", "\ud800", "ok\udfffok", set(), {1}, frozenset(),
    b"bytes", bytearray(b"x"), Decimal("1.5"), datetime(2025, 1, 1, tzinfo=UTC), date(2025, 1, 1), (1, 2),
    (), complex(1, 2), Opaque(), HUGE_INT, -HUGE_INT, range(3), uuid.UUID(int=1),
])
BAD_KEYS = st.sampled_from([1, 0, None, True, 1.5, ("a",), "k\x00", "\x00", "\udc80", frozenset(), b"k", Decimal(1),
                           HUGE_INT])


def _wrap(value, containers):
    """Put `value` inside containers, given outermost first ("list" or a dict key)."""
    for container in reversed(containers):
        value = [value] if container == "list" else {container: value}
    return value


CONTAINERS = st.lists(st.one_of(st.just("list"), JSON_KEYS), max_size=3)


def _nested(depth, leaf=1):
    value = leaf
    for level in range(depth):  # alternately objects and lists, the outermost an object
        value = [value] if (depth - 1 - level) % 2 else {"k": value}
    return value


def _size_case(filler, above_limit):
    """{"big": filler * n} with n characters as many as fit in MAX_ATTRIBUTE_BYTES (+ above_limit)."""
    overhead = len('{"big":""}')  # compact JSON, UTF-8: the measure MAX_ATTRIBUTE_BYTES applies to
    count = (MAX_BYTES - overhead) // len(filler.encode()) + above_limit
    size = overhead + count * len(filler.encode())
    assert (size <= MAX_BYTES) == (above_limit <= 0)
    return Arg({"big": filler * count}, None if above_limit <= 0 else InvalidAttribute, f"size {size} bytes")


FILLERS = st.sampled_from(["x", "é", "𝄞"])  # 1-, 2- and 4-byte characters
VALID_ATTRIBUTES = st.one_of(
    ok(st.none()),
    ok(JSON_OBJECTS, "json"),
    # A scalar under n containers (the top-level object included) sits at depth n.
    st.integers(min_value=1, max_value=MAX_DEPTH).map(lambda depth: Arg(_nested(depth), None, f"deep {depth} levels")),
    st.builds(_size_case, FILLERS, st.integers(min_value=-3, max_value=0)),
)
BAD_ATTRIBUTES = st.one_of(
    st.integers(min_value=MAX_DEPTH + 1, max_value=1500).map(
        lambda depth: Arg(_nested(depth), InvalidAttribute, f"deep {depth} levels")),
    st.builds(_size_case, FILLERS, st.integers(min_value=1, max_value=3)),
    st.just(Arg({str(i): "y" * 100 for i in range(700)}, InvalidAttribute, "size 700 keys of 100 bytes")),
    st.builds(lambda base, key, path, leaf: Arg({**base, key: _wrap(leaf, path)}, InvalidAttribute, "leaf"),
              JSON_OBJECTS, JSON_KEYS, CONTAINERS, BAD_LEAVES),
    st.builds(lambda base, key, path, bad_key: Arg({**base, key: _wrap({bad_key: 1}, path)}, InvalidAttribute, "key"),
              JSON_OBJECTS, JSON_KEYS, CONTAINERS, BAD_KEYS),
    st.builds(lambda base, bad_key: Arg({**base, bad_key: 1}, InvalidAttribute, "key at the top"),
              JSON_OBJECTS, BAD_KEYS),
    bad(InvalidAttribute, st.one_of(st.lists(JSON, max_size=3), st.text(max_size=5), st.integers(), st.just(()),
                                    st.just('{"a": 1}'), st.just({("a", 1)}), st.just(Opaque()), st.just([("a", 1)])),
        "json-top-level-not-an-object"),
)

# on_conflict= and max_wait=, as keyword arguments (a dict, as for the time): each left out at times,
# for its default ("error", and no cap). max_wait is for on_conflict="debounce" only.
LEFT_OUT = object()
OTHER_MODES = st.sampled_from([LEFT_OUT, None, "error", "replace", "keep"])
BAD_MODES = st.sampled_from(["merge", "ERROR", "", "keep ", "debounce ", "Debounce", 0, 1, True, False, ["error"],
                             b"keep", 1.5, HUGE_INT, Opaque()])
VALID_MAX_WAITS = st.one_of(
    st.timedeltas(min_value=timedelta(0)),  # up to timedelta.max: a cap that no time can reach
    st.sampled_from([None, timedelta(0), timedelta(microseconds=1), timedelta(seconds=1), 5000 * YEAR, timedelta.max]),
)
BAD_MAX_WAITS = st.one_of(  # with on_conflict="debounce"
    st.timedeltas(max_value=-timedelta(microseconds=1)),
    st.sampled_from([0, 5, -1, 0.0, 5.0, float("nan"), float("inf"), True, False, "5", "PT5S", b"5", Decimal(5),
                     [timedelta(seconds=5)], datetime(2025, 1, 1, tzinfo=UTC), date(2025, 1, 1), HUGE_INT, -HUGE_INT,
                     Opaque()]),
    st.integers(),
    st.floats(),
)


def _keywords(on_conflict, max_wait):
    """The keyword arguments given: those not LEFT_OUT."""
    return {name: value for name, value in (("on_conflict", on_conflict), ("max_wait", max_wait))
            if value is not LEFT_OUT}


VALID_CONFLICTS = st.one_of(
    ok(st.builds(_keywords, OTHER_MODES, st.sampled_from([LEFT_OUT, None]))),
    ok(st.builds(_keywords, st.just("debounce"), st.one_of(st.just(LEFT_OUT), VALID_MAX_WAITS))),
)
BAD_CONFLICTS = st.one_of(
    bad(InvalidOption, st.builds(_keywords, BAD_MODES, st.one_of(st.just(LEFT_OUT), VALID_MAX_WAITS, BAD_MAX_WAITS))),
    bad(InvalidOption, st.builds(_keywords, st.just("debounce"), BAD_MAX_WAITS)),
    bad(InvalidOption, st.builds(_keywords, OTHER_MODES,  # a max_wait without debounce, however good
                                 st.one_of(VALID_MAX_WAITS.filter(lambda max_wait: max_wait is not None),
                                           BAD_MAX_WAITS))),
)

FIELDS = {  # name: (valid values, invalid values)
    "biz_type": (VALID_BIZ_TYPES, BAD_BIZ_TYPES),
    "biz_id": (VALID_BIZ_IDS, BAD_BIZ_IDS),
    "when": (VALID_TIMES, BAD_TIMES),
    "attribute": (VALID_ATTRIBUTES, BAD_ATTRIBUTES),
    "conflict": (VALID_CONFLICTS, BAD_CONFLICTS),
}


def any_of(name):
    valid, invalid = FIELDS[name]
    return st.one_of(valid, invalid)


@st.composite
def schedule_args(draw):
    """schedule()'s arguments: all valid, or exactly one invalid (so the error class is known), or any mix."""
    mode = draw(st.sampled_from(["valid", "one invalid", "one invalid", "mixed"]))
    invalid = {draw(st.sampled_from(sorted(FIELDS)))} if mode == "one invalid" else set()
    if mode == "mixed":
        invalid = {name for name in sorted(FIELDS) if draw(st.booleans())}
    return {name: draw(FIELDS[name][name in invalid]) for name in FIELDS}


KEY_BIZ_IDS = st.sampled_from([1, "1", "2", "é"])  # few keys, so on_conflict meets waiting tasks; 1 and "1" are one key


@dataclass
class Item:
    """One element of bulk_schedule()'s iterable."""

    value: object
    args: list = field(default_factory=list)
    error: type | None = None
    label: str = ""

    @property
    def kwargs(self):
        return self.value

    @property
    def key(self):
        return (self.value["biz_type"], str(self.value["biz_id"]))

    def __repr__(self):
        return self.label or f"Item({self.args!r})"


@st.composite
def bulk_item(draw):
    kind = draw(st.sampled_from(["keyed"] * 4 + ["schedule args"] * 3 + ["not a dict", "unknown key", "no biz_type"]))
    if kind == "not a dict":
        value = draw(st.one_of(st.none(), st.integers(), st.text(max_size=3), st.just([("biz_type", "test.record")])))
        return Item(value, [Arg(value, TimeoutsError)], TimeoutsError, f"not a dict: {value!r}")
    fields = draw(schedule_args())
    if kind != "schedule args":  # valid, on a few keys, so that on_conflict meets waiting tasks
        fields.update(biz_type=draw(VALID_BIZ_TYPES), biz_id=Arg(draw(KEY_BIZ_IDS)), when=draw(VALID_TIMES),
                      attribute=draw(VALID_ATTRIBUTES), conflict=draw(VALID_CONFLICTS))
    value = {"biz_type": fields["biz_type"].value, "biz_id": fields["biz_id"].value, **fields["when"].value,
             **fields["conflict"].value}
    attribute = fields["attribute"]
    if attribute.error is not None or attribute.value is not None or draw(st.booleans()):  # None: left out at times
        value["attribute"] = attribute.value
    args = list(fields.values())
    if kind == "unknown key":
        value["using"] = "default"
        args = [Arg("using", TimeoutsError)]  # reported before any value is looked at
    if kind == "no biz_type":
        del value["biz_type"]
        args = [Arg(None, TimeoutsError)]
    error = next((arg.error for arg in args if arg.error is not None), None)
    return Item(value, args, error)


def bulk_items():
    return st.lists(bulk_item(), max_size=4)
