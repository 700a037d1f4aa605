"""The changelist's filters. None of them queries the table to build its choices (Django's default
filter for a CharField would run SELECT DISTINCT over every row), and each one's condition is
served by an index and names action_time bounds where it can, so PostgreSQL skips the partitions
that cannot hold a match (at plan time for constants, at executor start-up for STATEMENT_TIMESTAMP).
"""

from datetime import datetime, time, timedelta

from django.contrib import admin
from django.db.models.functions import Now
from django.utils import timezone

from timeouts import registry
from timeouts.limiting import lateness
from timeouts.states import Status
from timeouts.storage import shards

# Statuses only a task that has started can have: its action_time is in the past, so the future
# partitions need not be read (started_at >= run_at >= action_time, by the compare-and-set and a
# CHECK constraint).
STARTED_STATUSES = (Status.RUNNING, Status.DONE, Status.DEAD)


class ShardFilter(admin.SimpleListFilter):
    """Offered when TIMEOUTS["SHARDS"] names several databases. One shard: the changelist is that
    database's, everything as with a single shard. "All shards", the default: each shard runs the
    same query and the page merges their rows (merged.py). Choices come from the settings."""

    title = "shard"
    parameter_name = "shard"

    def lookups(self, request, model_admin):
        return [(alias, alias) for alias in shards.aliases()]

    def choices(self, changelist):
        every, *each = super().choices(changelist)
        yield {**every, "display": "all shards"}
        yield from each

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        if value not in shards.aliases():
            return queryset.none()
        return queryset.using(value)


class StatusFilter(admin.SimpleListFilter):
    """Indexes: PENDING, CANCELLED and DEAD: timeouts_task_status (status, action_time);
    DISPATCHED and RUNNING: timeouts_task_lease (few rows, sorted); DONE: timeouts_task_action_time,
    past partitions only."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [(str(value), label) for value, label in Status.choices]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        try:
            status = Status(int(value))
        except ValueError:
            return queryset.none()
        queryset = queryset.filter(status=status)
        if status in STARTED_STATUSES:
            queryset = queryset.filter(action_time__lte=Now())
        return queryset


class BizTypeFilter(admin.SimpleListFilter):
    """Choices are the handlers registered in this process and the biz_types it noted of each kind
    of work (timeouts.registry: the Celery tasks whose calls DurableTask stores), plus the value
    asked for, if it is not one of them: tasks of a handler that was removed can still be listed.
    Index: timeouts_task_biz_type."""

    title = "biz type"
    parameter_name = "biz_type"

    def lookups(self, request, model_admin):
        names = set(registry.registered()).union(*registry.noted_of_kinds().values())
        value = self.value()
        if value and registry.BIZ_TYPE_RE.fullmatch(value):
            names.add(value)
        return [(name, name) for name in sorted(names)]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(biz_type=value)


class DueWindowFilter(admin.SimpleListFilter):
    """When tasks are (or were) due. "today" is the current day in Django's current time zone.

    - overdue: PENDING and due by the database clock (TimeoutTask.objects.due()): timeouts_task_due,
      past partitions only;
    - next hour / today: every status, by action_time: timeouts_task_action_time, one or two
      partitions."""

    title = "due"
    parameter_name = "due"

    def lookups(self, request, model_admin):
        return [("overdue", "overdue (pending, due)"), ("next_hour", "in the next hour"), ("today", "today")]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        if value == "overdue":
            now = Now()
            return queryset.filter(status=Status.PENDING, run_at__lte=now, action_time__lte=now)
        if value == "next_hour":
            return queryset.filter(action_time__gte=Now(), action_time__lt=Now() + timedelta(hours=1))
        if value == "today":
            start, end = today_bounds()
            return queryset.filter(action_time__gte=start, action_time__lt=end)
        return queryset.none()


class EndedLateFilter(admin.SimpleListFilter):
    """Tasks that a start later than their lateness policy allows ended (timeouts.limiting.lateness):
    skipped (CANCELLED) or DEAD, their last_error beginning with lateness.NOT_RUN. Index:
    timeouts_task_status (status, action_time), past partitions only (such a task was due before
    it started); last_error is checked row by row among that status's tasks."""

    title = "ended late"
    parameter_name = "late"
    STATUSES = {"skip": Status.CANCELLED, "dead": Status.DEAD}

    def lookups(self, request, model_admin):
        return [("skip", "skipped (cancelled)"), ("dead", "dead")]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        if value not in self.STATUSES:
            return queryset.none()
        return queryset.filter(status=self.STATUSES[value], last_error__startswith=lateness.NOT_RUN,
                               action_time__lte=Now())


def today_bounds(now=None):
    """[midnight, next midnight) of the current day in the current time zone, as aware datetimes."""
    zone = timezone.get_current_timezone()
    day = timezone.localtime(now, zone).date()
    start = timezone.make_aware(datetime.combine(day, time.min), zone)
    end = timezone.make_aware(datetime.combine(day + timedelta(days=1), time.min), zone)
    return start, end
