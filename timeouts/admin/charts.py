"""Small charts for the businesses page, drawn on the server as inline SVG: no JavaScript, no
static files, nothing for the host project to build. Each chart is a row of bars with a <title> per
bar (the browser shows it on hover) and an aria-label that says in words what the bars show.

- due_chart(): tasks falling due in each bucket of the coming hour. When the query stopped at its
  row limit before the end of the hour, the part it did not read is hatched: "at least" there.
- lateness_chart(): per bucket of the last minutes, p99 (pale bar) behind p50 (dark bar).
"""

from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from timeouts import stats

WIDTH, HEIGHT = 180, 40
GAP = 1
DUE_COLOUR = "#1d4ed8"
P50_COLOUR = "#b45309"
P99_COLOUR = "#fbbf24"
UNREAD = "#9ca3af"

_PATTERN = ('<defs><pattern id="{}" width="4" height="4" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)"><rect width="2" height="4" fill="{}"/></pattern></defs>')


def _svg(label, body, css_class):
    return format_html(
        '<svg class="timeouts-chart {}" width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="{}" '
        'xmlns="http://www.w3.org/2000/svg"><rect class="timeouts-chart-frame" x="0" y="0" width="{}" '
        'height="{}" fill="none" stroke="#d1d5db"/>{}</svg>',
        css_class, WIDTH, HEIGHT, WIDTH, HEIGHT, label, WIDTH, HEIGHT, body)


def _bar(x, width, value, top, colour, title):
    """A bar of `value` on a scale whose top is `top` (a visible sliver for any value above 0)."""
    height = 0.0 if not value else max(1.0, (HEIGHT - 2) * min(value / top, 1.0))
    return format_html('<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>',
                       _n(x), _n(HEIGHT - 1 - height), _n(width), _n(height), colour, title)


def _n(value):
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _unread(first, last, width, chart_id):
    """The hatched span of the buckets first..last-1, which the query did not read to their end."""
    pattern_id = f"timeouts-unread-{chart_id}"
    return format_html(_PATTERN + '<rect class="timeouts-chart-unread" x="{}" y="0" width="{}" height="{}" '
                       'fill="url(#{})"><title>not read: more tasks than the page reads</title></rect>',
                       pattern_id, UNREAD, _n(first * width), _n((last - first) * width), HEIGHT, pattern_id)


def due_chart(buckets, *, read_buckets=None, chart_id="due"):
    """`buckets`: [(label, count)] in time order. `read_buckets`: how many of them, from the first,
    were read to their end (None: all); the others are hatched, their counts lower bounds."""
    n = len(buckets)
    read = n if read_buckets is None else read_buckets
    width = WIDTH / max(n, 1)
    top = max([count for _, count in buckets] + [1])
    parts = [_unread(read, n, width, chart_id)] if read < n else []
    for i, (label, count) in enumerate(buckets):
        more = "at least " if i >= read else ""
        parts.append(_bar(i * width + GAP / 2, width - GAP, count, top, DUE_COLOUR, f"{label}: {more}{count:,} due"))
    total = sum(count for _, count in buckets)
    label = (f"{'at least ' if read < n else ''}{total:,} tasks due in the next hour, at most {top:,} "
             f"in one bucket")
    return _svg(label, mark_safe("".join(parts)), "timeouts-chart-due")


def lateness_chart(buckets, *, unread_buckets=0, chart_id="lateness"):
    """`buckets`: [(label, p50 seconds or None, p99 seconds or None, tasks)] in time order, oldest
    first. `unread_buckets`: how many of the oldest were not read to their end (hatched)."""
    n = len(buckets)
    width = WIDTH / max(n, 1)
    top = max([p99 or 0.0 for _, _, p99, _ in buckets] + [p50 or 0.0 for _, p50, _, _ in buckets]) or 1.0
    parts = [_unread(0, unread_buckets, width, chart_id)] if unread_buckets else []
    for i, (label, p50, p99, tasks) in enumerate(buckets):
        if not tasks:
            continue
        x = i * width + GAP / 2
        title = f"{label}: p50 {stats.seconds(p50)}, p99 {stats.seconds(p99)}, {tasks:,} tasks"
        parts.append(_bar(x, width - GAP, p99, top, P99_COLOUR, title))
        parts.append(_bar(x + width / 4, (width - GAP) / 2, p50, top, P50_COLOUR, title))
    worst = max((p99 for _, _, p99, tasks in buckets if tasks and p99 is not None), default=None)
    label = "no task fell due" if worst is None else f"lateness, the worst minute's p99: {stats.seconds(worst)}"
    return _svg(label, mark_safe("".join(parts)), "timeouts-chart-lateness")


def legend():
    """The colours' key, once per page."""
    return format_html_join(
        " ", '<span class="timeouts-legend"><span style="display:inline-block;width:10px;height:10px;'
        'background:{}"></span> {}</span>',
        [(DUE_COLOUR, "due"), (P50_COLOUR, "lateness p50"), (P99_COLOUR, "lateness p99"),
         (UNREAD, "not read (hatched)")])
