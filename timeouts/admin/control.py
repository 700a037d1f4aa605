"""The limits and pause of each biz_type, as the businesses page shows and changes them: what is in
force, the handler's own values beside an override, and each change through the public API
(timeouts.pause(), resume(), set_limits(), reset_limits()), described for the admin log."""

from dataclasses import dataclass

import timeouts as api

from .. import registry
from ..errors import InvalidOption

# A version without limits and pauses: the page shows none.
AVAILABLE = all(hasattr(api, name) for name in ("limits", "pause", "resume", "set_limits", "reset_limits"))


@dataclass(frozen=True)
class BizTypeLimits:
    rate_limit: float | None  # in force; None: no limit
    concurrency: int | None
    paused: bool
    handler_rate_limit: float | None  # what the handler declares (@timeouts.handler)
    handler_concurrency: int | None
    overridden: bool  # set_limits() replaced the handler's values
    changeable: bool  # the API takes this biz_type: a handler's, or a DurableTask's

    @property
    def shown(self):
        """The values as the page shows them: "100/s", "20", "none"."""
        return {"rate_limit": _per_second(self.rate_limit), "concurrency": _show(self.concurrency),
                "handler_rate_limit": _per_second(self.handler_rate_limit),
                "handler_concurrency": _show(self.handler_concurrency),
                "rate_limit_input": _show(self.rate_limit, ""), "concurrency_input": _show(self.concurrency, "")}


def all_limits(biz_types, stored) -> dict[str, BizTypeLimits]:
    """The limits of each biz_type (None for every one in a version without limits), from the
    stored ones (stats.stored_limits()); a biz_type without a row has its handler's own values,
    unpaused."""
    if not AVAILABLE:
        return {biz_type: None for biz_type in biz_types}
    found = {}
    for biz_type in biz_types:
        handler = registry.find_handler(biz_type)
        own = (getattr(handler, "rate_limit", None), getattr(handler, "concurrency", None))
        row = stored.get(biz_type)
        changeable = _changeable(biz_type)
        if row is None:
            found[biz_type] = BizTypeLimits(*own, False, *own, False, changeable)
        else:
            found[biz_type] = BizTypeLimits(row["rate_limit"], row["concurrency"], row["paused"],
                                            row["declared_rate_limit"], row["declared_concurrency"],
                                            row["overridden"], changeable)
    return found


def _changeable(biz_type):
    """What timeouts.limits accepts: a handler's biz_type, or any Celery call's."""
    return registry.find_handler(biz_type) is not None or biz_type.startswith(registry.CELERY_CALLS)


def pause(biz_type) -> str | None:
    if api.limits(biz_type).paused:
        return None
    api.pause(biz_type)
    return "paused"


def resume(biz_type) -> str | None:
    if not api.limits(biz_type).paused:
        return None
    api.resume(biz_type)
    return "resumed"


def set_limits(biz_type, rate_limit_text, concurrency_text) -> str:
    """From the page's form, where a blank field means no limit."""
    rate_limit = _number(rate_limit_text, float, "rate_limit")
    concurrency = _number(concurrency_text, int, "concurrency")
    before = api.limits(biz_type)
    api.set_limits(biz_type, rate_limit=rate_limit, concurrency=concurrency)
    return "set limits: " + _changes(before, api.limits(biz_type))


def reset_limits(biz_type) -> str:
    before = api.limits(biz_type)
    api.reset_limits(biz_type)
    return "limits reset to the handler's: " + _changes(before, api.limits(biz_type))


def _changes(before, after):
    return (f"rate_limit {_per_second(before.rate_limit)} -> {_per_second(after.rate_limit)}, "
            f"concurrency {_show(before.concurrency)} -> {_show(after.concurrency)}")


def _number(text, kind, name):
    text = (text or "").strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise InvalidOption(f"{name} must be {'a number' if kind is float else 'a whole number'} "
                            f"or blank (no limit), got {text!r}") from None


def _show(value, none="none"):
    return none if value is None else f"{value:g}"


def _per_second(value):
    return "none" if value is None else f"{value:g}/s"
