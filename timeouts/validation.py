"""Turn what callers pass to `schedule()` into clean column values, or raise a typed error.

Everything here runs before any SQL, so rejected input stores nothing and a bad row never reaches
(and aborts) a batch.
"""

import json
import math
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from timeouts.errors import InvalidAttribute, InvalidBizId, InvalidOption, InvalidTime

# What a biz_type is made of: a handler's name, or a kind's prefix and what follows it.
BIZ_TYPE_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

MAX_BIZ_ID_LENGTH = 255
MAX_ATTRIBUTE_DEPTH = 64
# A delay is added to the database clock, and the row must still be readable as a Python datetime
# (years 1 to 9999). The margin covers any skew between the application's and the database's clocks.
DELAY_CLOCK_MARGIN = timedelta(days=1)
# An attribute left out, or empty, as JSON text.
EMPTY_ATTRIBUTE = "{}"
ON_CONFLICT = (None, "error", "replace", "keep", "debounce")
# What schedule() does when the key already has a waiting task, unless told otherwise: refuse, so
# that a second call for one business object is never a silent second timeout.
DEFAULT_ON_CONFLICT = "error"
# The bounds of a limit. The claim refills a rate limit's token bucket at the rate for the time since
# its last claim, the dispatcher sleeps until the bucket is full again (1 / rate, as an interval),
# and each of several shards takes an integer part of a concurrency (limit * shards in 32 bits): a
# limit within these keeps all of that inside float8, interval and integer range, on as many shards
# as there are slots (sql/migrations/0001_limits.sql: the claims read a stored row as within them too). Below one
# start a day, pause() the biz_type instead; past a million starts a second or a million tasks
# running at once, a limit holds nothing back that None would not.
MIN_RATE_LIMIT = 1 / 86400
MAX_RATE_LIMIT = 1_000_000.0
MAX_CONCURRENCY = 1_000_000
# What becomes of an attempt that starts later than its max_lateness (timeouts.limiting.lateness).
ON_LATE = ("run", "skip", "dead")


def biz_id(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, uuid.UUID)):
        raise InvalidBizId(f"biz_id must be a str, int or UUID, got {type(value).__name__}")
    if isinstance(value, int) and value.bit_length() > 4 * MAX_BIZ_ID_LENGTH:
        # Far more than 255 digits; and str() refuses ints of over 4300 digits with a plain ValueError.
        raise InvalidBizId(f"biz_id is an int of {value.bit_length()} bits: over {MAX_BIZ_ID_LENGTH} characters")
    text = str(value)
    if not text:
        raise InvalidBizId("biz_id must not be empty")
    if len(text) > MAX_BIZ_ID_LENGTH:
        raise InvalidBizId(f"biz_id is {len(text)} characters long; the limit is {MAX_BIZ_ID_LENGTH}")
    if "\x00" in text:
        raise InvalidBizId("biz_id must not contain NUL (\\u0000): PostgreSQL text cannot store it")
    if not _encodable(text):
        raise InvalidBizId("biz_id holds a lone surrogate (\\ud800-\\udfff), which UTF-8 cannot encode")
    return text


def describe(value) -> str:
    """A rejected value for an error message. Not plain repr(): it fails for an int of over 4300 digits,
    may be huge, and a custom object's may raise anything."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, float):
        return float.__repr__(value)
    if isinstance(value, str) or (isinstance(value, int) and value.bit_length() <= 256):
        text = str.__repr__(value) if isinstance(value, str) else int.__repr__(value)
        return text if len(text) <= 100 else f"{text[:100]}... ({len(text)} characters)"
    if isinstance(value, int):
        return f"an int of {value.bit_length()} bits"
    return f"a value of type {type(value).__name__}"


def _encodable(text) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def action_time(at=None, delay=None):
    """Return `(at_utc, delay)`: exactly one is not None.

    A delay stays a timedelta so the database adds it to its own clock (`clock_timestamp()`): due-ness
    is decided on the database clock, so the application's clock must not leak in.
    """
    if (at is None) == (delay is None):
        raise InvalidTime("give exactly one of at= (an aware datetime) or delay= (a timedelta or seconds)")
    if at is not None:
        if not isinstance(at, datetime):
            raise InvalidTime(f"at must be a datetime, got {type(at).__name__}")
        if at.tzinfo is None or at.utcoffset() is None:
            raise InvalidTime(
                f"at must be timezone-aware, got the naive datetime {at.isoformat()}: "
                "use django.utils.timezone.now() or attach a tzinfo"
            )
        try:
            return at.astimezone(UTC), None
        except (OverflowError, ValueError) as exc:
            raise InvalidTime(f"at={at!r} cannot be converted to UTC: {exc}") from None
    if isinstance(delay, bool) or not isinstance(delay, (timedelta, int, float)):
        raise InvalidTime(f"delay must be a timedelta or a number of seconds, got {type(delay).__name__}")
    if isinstance(delay, (int, float)):
        if isinstance(delay, float) and not math.isfinite(delay):  # (isfinite() of a huge int overflows)
            raise InvalidTime(f"delay must be a finite number of seconds, got {delay!r}")
        try:
            delay = timedelta(seconds=delay)
        except OverflowError:
            raise InvalidTime(f"delay={describe(delay)} (seconds) is out of range") from None
    now = datetime.now(UTC)
    earliest = datetime.min.replace(tzinfo=UTC) + DELAY_CLOCK_MARGIN - now
    latest = datetime.max.replace(tzinfo=UTC) - DELAY_CLOCK_MARGIN - now
    if not earliest <= delay <= latest:
        raise InvalidTime(f"delay={delay!r} puts the task outside the years 1 to 9999")
    return None, delay


def attribute(value, max_bytes) -> str:
    """Return the attribute as JSON text, checked to round-trip through jsonb unchanged."""
    # The common case, none or an empty one: what json.dumps() writes for it, without the encoder's
    # set-up on every call.
    text = EMPTY_ATTRIBUTE if value is None or (type(value) is dict and not value) else _json_text(value)
    size = len(text.encode())
    if size > max_bytes:
        raise InvalidAttribute(f"attribute is {size} bytes as JSON; MAX_ATTRIBUTE_BYTES is {max_bytes}")
    return text


def _json_text(value) -> str:
    if type(value) is not dict:  # the common case skips the ABC's check and the copy
        if not isinstance(value, Mapping):
            raise InvalidAttribute(f"attribute must be a JSON object (a dict), got {type(value).__name__}")
        value = dict(value)  # a read-only mapping too; what it holds must be JSON as it is
    _check_json(value, "attribute", 0)
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except ValueError as exc:  # an int of more digits than int -> str allows (sys.get_int_max_str_digits)
        raise InvalidAttribute(f"attribute cannot be written as JSON: {exc}") from None


def _check_json(value, path, depth):
    # Stricter than json.dumps on purpose: it would turn tuples into lists and int keys into strings,
    # so the handler would not get back what was scheduled.
    if depth > MAX_ATTRIBUTE_DEPTH:
        raise InvalidAttribute(f"{path} is nested deeper than {MAX_ATTRIBUTE_DEPTH} levels")
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidAttribute(f"{path} is {value!r}: JSON (and jsonb) has no NaN or Infinity")
    elif isinstance(value, str):
        if "\x00" in value:
            raise InvalidAttribute(f"{path} contains NUL (\\u0000), which jsonb cannot store")
        if not _encodable(value):
            raise InvalidAttribute(f"{path} holds a lone surrogate, which UTF-8 (and jsonb) cannot encode")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidAttribute(f"{path} has the key {describe(key)}, not a str: JSON object keys are str")
            if "\x00" in key:
                raise InvalidAttribute(f"{path} has a key containing NUL (\\u0000)")
            if not _encodable(key):
                raise InvalidAttribute(f"{path} has a key holding a lone surrogate, which UTF-8 cannot encode")
            _check_json(item, f"{path}[{key!r}]", depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]", depth + 1)
    else:
        raise InvalidAttribute(f"{path} holds a {type(value).__name__}, which is not JSON")


def on_conflict(value):
    if value not in ON_CONFLICT:
        raise InvalidOption(
            f'on_conflict must be None, "error", "replace", "keep" or "debounce", got {describe(value)}')
    return value


def max_wait(value, on_conflict_value):
    """How long after a key's first scheduling its debounced task may wait at most: None (no cap) or
    a timedelta of zero or more, and only with on_conflict="debounce", the one mode that moves a task."""
    if value is None:
        return None
    if on_conflict_value != "debounce":
        raise InvalidOption(f'max_wait is for on_conflict="debounce", not on_conflict={describe(on_conflict_value)}')
    if not isinstance(value, timedelta):
        raise InvalidOption(f"max_wait must be a timedelta or None, got {describe(value)}")
    if value < timedelta(0):
        raise InvalidOption(f"max_wait must not be negative, got {value!r}")
    return value


def check_rate_limit(value, error):
    """A rate limit: None, or a number of starts per second from one a day to a million a second."""
    if value is None:
        return None
    # NaN fails the comparison too; an int of any size compares exactly (float() of it may overflow).
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_RATE_LIMIT <= value <= MAX_RATE_LIMIT:
        raise error("rate_limit must be None or a number of starts per second from one start a day "
                    f"({MIN_RATE_LIMIT:.6g}) to a million a second ({MAX_RATE_LIMIT:.0f}), got {describe(value)}")
    return float(value)


def check_concurrency(value, error):
    """A concurrency limit: None, or a whole number of running tasks from 1 to MAX_CONCURRENCY."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENCY:
        raise error(f"concurrency must be None or an integer of at least 1 and at most {MAX_CONCURRENCY}, "
                    f"got {describe(value)}")
    return value


def check_lateness_policy(max_lateness, on_late, error) -> tuple[timedelta | None, str]:
    """A lateness policy (timeouts.limiting.lateness): (max_lateness, on_late) as given, or
    `error(message)` naming what is wrong with them."""
    if max_lateness is not None and (not isinstance(max_lateness, timedelta) or max_lateness <= timedelta(0)):
        shown = repr(max_lateness) if isinstance(max_lateness, timedelta) else describe(max_lateness)
        raise error(f"max_lateness must be a positive timedelta or None (no limit), got {shown}")
    if not isinstance(on_late, str) or on_late not in ON_LATE:
        raise error(f"on_late must be 'run', 'skip' or 'dead', got {describe(on_late)}")
    if on_late != "run" and max_lateness is None:
        raise error(f"on_late={on_late!r} needs a max_lateness: how late a start may come before the task "
                    f"is {'skipped' if on_late == 'skip' else 'made dead'} instead")
    return max_lateness, on_late
