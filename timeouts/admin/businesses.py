"""The businesses page: every biz_type this deployment knows, with what is waiting, what is coming,
how late it runs, and the limits, pause and lateness policy in force; where an operator looks first
in an incident.

Reached from the task list (/admin/timeouts/timeouttask/businesses/), for staff who may view
tasks. Pausing, resuming and setting limits or the lateness policy from it need the permission
`timeouts.change_limits`; each change goes through timeouts.pause(), resume(), set_limits() or
reset_limits(), and into the admin log.

Every number on it comes from bounded, index-served queries (timeouts.stats, sql/queries/stats.sql), so
it answers as fast on tens of millions of rows as on a few. With several shards it shows one shard's
numbers at a time (the first, or the one `?shard=` names: each shard's charts are its own, and
percentiles of several do not add up); limits and pauses are written to every shard.
"""

from dataclasses import dataclass

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse

from timeouts import registry, stats
from timeouts.admin import charts, control
from timeouts.errors import InvalidOption, TimeoutsError
from timeouts.limiting import policies
from timeouts.models import TimeoutTask
from timeouts.storage import shards
from timeouts.store import clock
from timeouts.validation import ON_LATE

PERMISSION = "timeouts.change_limits"


@dataclass
class Row:
    biz_type: str
    sources: tuple[str, ...]
    overdue: stats.Count
    due_soon: stats.Buckets
    lateness: stats.Buckets
    limits: stats.BizTypeLimits
    running: stats.Count
    changeable: bool
    policy: policies.Policy

    @property
    def shown(self):
        return control.shown(self.limits)

    @property
    def policy_shown(self):
        return control.shown_policy(self.policy)

    @property
    def overridden(self):
        """What reset_limits() would undo: the limits, or the lateness policy."""
        return self.limits.overridden or self.policy.overridden

    @property
    def due_chart(self):
        buckets = [(self.due_soon.label(i), n) for i, n in enumerate(self.due_soon.values)]
        return charts.due_chart(buckets, read_buckets=self.due_soon.unread[0], chart_id=f"due-{self.biz_type}")

    @property
    def overdue_shown(self):
        return str(self.overdue)  # "1,234", or "~1,234" estimated

    @property
    def running_shown(self):
        return _at_least(self.running.value, self.running.exact)

    @property
    def due_total(self):
        return _at_least(sum(self.due_soon.values), self.due_soon.complete)

    @property
    def lateness_chart(self):
        buckets = [(self.lateness.label(i), *(value or (None, None, 0)))
                   for i, value in enumerate(self.lateness.values)]
        return charts.lateness_chart(buckets, unread_buckets=self.lateness.unread[1],
                                     chart_id=f"late-{self.biz_type}")

    @property
    def worst_p99(self):
        found = [value[1] for value in self.lateness.values if value]
        return stats.seconds(max(found)) if found else "-"

    @property
    def latest_p50(self):
        found = [value[0] for value in self.lateness.values if value]
        return stats.seconds(found[-1]) if found else "-"


def _at_least(n, exact):
    return f"{n:,}" if exact else f"\u2265 {n:,}"


def rows(using="default"):
    """(database now, [Row]) for every known biz_type, in order."""
    now = clock.database_now(using)
    found = stats.biz_types(now, using=using)
    names = [biz_type.name for biz_type in found]
    due = stats.due_soon(names, now, using=using)
    late = stats.recent_lateness(names, now, using=using)
    policy = policies.policies(names, using=using)
    return now, [Row(b.name, b.sources, b.overdue, due[b.name], late[b.name], b.limits, b.running,
                     control.changeable(b.name), policy[b.name]) for b in found]


def businesses_view(model_admin, request):
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    can_change = request.user.has_perm(PERMISSION)
    if request.method == "POST":
        if not can_change:
            raise PermissionDenied
        _change(request)
        return HttpResponseRedirect(request.get_full_path())
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD", "POST"])
    aliases = shards.aliases()
    shard = request.GET.get("shard") if request.GET.get("shard") in aliases else aliases[0]
    now, found = rows(using=shard)
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": "Businesses",
        "subtitle": None,
        "now": now,
        "rows": found,
        "overdue_limit": f"{stats.OVERDUE_LIMIT:,}",
        "legend": charts.legend(),
        "can_change": can_change,
        "on_late_choices": ON_LATE,
        "shards": aliases if len(aliases) > 1 else (),
        "shard": shard,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/timeouts/businesses.html", context)


def _change(request):
    action = request.POST.get("action")
    biz_type = request.POST.get("biz_type", "")
    try:
        registry.check_biz_type(biz_type)
        if action == "pause":
            message = control.pause(biz_type)
        elif action == "resume":
            message = control.resume(biz_type)
        elif action == "set_limits":
            message = control.set_limits(biz_type, request.POST.get("rate_limit", ""),
                                         request.POST.get("concurrency", ""))
        elif action == "set_lateness":
            message = control.set_lateness(biz_type, request.POST.get("max_lateness", ""),
                                           request.POST.get("on_late", ""))
        elif action == "reset_limits":
            message = control.reset_limits(biz_type)
        else:
            raise InvalidOption(f"unknown action {action!r}")
    except TimeoutsError as error:
        messages.error(request, f"Nothing was changed: {error}")
        return
    if message is None:
        messages.info(request, f"Biz type {biz_type}: nothing to change.")
        return
    # Of a biz_type, not of a task: the entry names the task model, whose permission it took, and
    # no object id (the admin would link it to a task of that id).
    LogEntry.objects.create(user_id=request.user.pk, content_type=ContentType.objects.get_for_model(TimeoutTask),
                            object_id=None, object_repr=f"biz_type {biz_type}", action_flag=CHANGE,
                            change_message=message)
    messages.success(request, f"Biz type {biz_type}: {message}.")
