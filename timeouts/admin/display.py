"""How a task's fields read in the admin: coloured status, lateness, formatted JSON, tracebacks."""

import json

from django.utils import timezone
from django.utils.html import format_html

from timeouts import stats
from timeouts.states import Status

# Background colours with white text (contrast >= 4.5:1), in both of the admin's themes.
STATUS_COLOURS = {
    Status.PENDING: "#1d4ed8",
    Status.DISPATCHED: "#6d28d9",
    Status.RUNNING: "#b45309",
    Status.DONE: "#15803d",
    Status.CANCELLED: "#4b5563",
    Status.DEAD: "#b91c1c",
}
BADGE = ('<span class="timeouts-status timeouts-status-{}" style="background:{};color:#fff;'
         'padding:1px 7px;border-radius:9px;white-space:nowrap">{}</span>')


def status_badge(task):
    status = Status(task.status)
    return format_html(BADGE, status.label, STATUS_COLOURS[status], status.label)


def lateness(task, now=None):
    """started_at - action_time once started; for a task that has not started, how long it has
    been overdue (or nothing, if it is not due yet)."""
    if task.started_at is not None:
        return stats.seconds(task.started_at - task.action_time)
    if task.status in (Status.PENDING, Status.DISPATCHED):
        waited = (now or timezone.now()) - task.run_at
        if waited.total_seconds() > 0:
            return format_html('<span class="timeouts-overdue" style="color:#b91c1c">waiting {}</span>',
                               stats.seconds(waited))
    return "-"


def attribute_json(task):
    text = json.dumps(task.attribute, indent=2, sort_keys=True, ensure_ascii=False)
    return format_html('<pre class="timeouts-json" style="margin:0;white-space:pre-wrap">{}</pre>', text)


def last_error(task):
    if not task.last_error:
        return "-"
    return format_html(
        '<pre class="timeouts-traceback" style="margin:0;max-height:30em;overflow:auto;white-space:pre-wrap">{}</pre>',
        task.last_error)


def moment(value):
    """A timestamp to the millisecond, in the current time zone: '2026-11-21 01:46:05.123 UTC'."""
    if value is None:
        return "-"
    local = timezone.localtime(value)
    return f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} {local:%Z}"


def attempts(task):
    return f"{task.attempts} of {task.max_attempts}"
