"""Sizes and durations as the admin and `timeouts_stats` write them."""

import math
from datetime import timedelta


def human_bytes(n) -> str:
    if n is None:
        return "?"
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def seconds(value) -> str:
    """0.0123 -> '12.3 ms', 75 -> '1 min 15 s'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if abs(value) < 0.1:
        return f"{value * 1000:.1f} ms"
    if abs(value) < 1:
        return f"{value * 1000:.0f} ms"
    if abs(value) < 120:
        return f"{value:.2f} s"
    minutes, secs = divmod(round(value), 60)
    if minutes < 120:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"
