"""Changes to a biz_type's limits, pause and lateness policy from the businesses page, through the
public API (timeouts.pause(), resume(), set_limits(), reset_limits()), each described for the admin
log; and how the page shows the values."""

import math
from datetime import timedelta

import timeouts as api
from timeouts import registry
from timeouts.errors import InvalidOption


def changeable(biz_type):
    """What timeouts.limits() and the others take (registry.check_known)."""
    return registry.is_known(biz_type)


def shown(limits):
    """A stats.BizTypeLimits as the page shows it: "100/s", "20", "none"."""
    return {"rate_limit": per_second(limits.rate_limit), "concurrency": show(limits.concurrency),
            "handler_rate_limit": per_second(limits.handler_rate_limit),
            "handler_concurrency": show(limits.handler_concurrency),
            "rate_limit_input": show(limits.rate_limit, ""), "concurrency_input": show(limits.concurrency, "")}


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


def set_lateness(biz_type, max_lateness_text, on_late_text) -> str:
    """From the page's form: max_lateness in seconds (blank: no limit), and on_late."""
    max_lateness = _seconds(max_lateness_text)
    before = api.limits(biz_type)
    api.set_limits(biz_type, max_lateness=max_lateness, on_late=(on_late_text or "").strip() or "run")
    return "set lateness policy: " + _policy_changes(before, api.limits(biz_type))


def reset_limits(biz_type) -> str:
    before = api.limits(biz_type)
    api.reset_limits(biz_type)
    after = api.limits(biz_type)
    policy = (before.max_lateness, before.on_late) != (after.max_lateness, after.on_late)
    return "limits reset to the handler's: " + _changes(before, after) + (
        f", {_policy_changes(before, after)}" if policy else "")


def _changes(before, after):
    return (f"rate_limit {per_second(before.rate_limit)} -> {per_second(after.rate_limit)}, "
            f"concurrency {show(before.concurrency)} -> {show(after.concurrency)}")


def _policy_changes(before, after):
    return (f"max_lateness {duration(before.max_lateness)} -> {duration(after.max_lateness)}, "
            f"on_late {before.on_late} -> {after.on_late}")


def _seconds(text):
    """A max_lateness typed as seconds, or None for a blank field."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(text)
        return timedelta(seconds=seconds)
    except (ValueError, OverflowError):
        raise InvalidOption(f"max_lateness must be a positive number of seconds or blank (no limit), "
                            f"got {text!r}") from None


def _number(text, kind, name):
    text = (text or "").strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise InvalidOption(f"{name} must be {'a number' if kind is float else 'a whole number'} "
                            f"or blank (no limit), got {text!r}") from None


def show(value, none="none"):
    """2.5 -> "2.5", 1000000.0 -> "1000000", 20 -> "20": as typed into the form, and read back."""
    return none if value is None else f"{value:.15g}"


def per_second(value):
    return "none" if value is None else f"{show(value)}/s"


def duration(value):
    """A max_lateness as the page shows it: "300 s", "none"."""
    return "none" if value is None else f"{show(value.total_seconds())} s"


def shown_policy(policy):
    """A limiting.policies.Policy as the page shows it."""
    return {"max_lateness": duration(policy.max_lateness), "on_late": policy.on_late,
            "handler": f"{duration(policy.handler_max_lateness)}, {policy.handler_on_late}",
            "max_lateness_input": "" if policy.max_lateness is None else show(policy.max_lateness.total_seconds())}
