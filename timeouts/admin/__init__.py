"""The operators' admin for TimeoutTask, built to stay fast on tens of millions of rows.

- Counting: an estimated count instead of COUNT(*) (paginator.py), no full-table count, no facets,
  no date_hierarchy.
- Filters (filters.py: status, biz type, due window, ended late) and the ordering (action_time
  only) are each served by an index and pruned to the partitions they need; search is by exact job
  id or biz_id (two index probes).
- Actions (actions.py): cancel, requeue, run now, through the ORM API, with their own permissions,
  logged in the admin log.
- The businesses page (businesses.py), beside the list: every biz_type with its overdue and coming
  tasks, its lateness, and its limits, pause and lateness policy, which `timeouts.change_limits` may
  change.
- Shards (TIMEOUTS["SHARDS"], several databases): a shard filter; "all shards", the default, merges
  each shard's first rows into the page and sums their counts (merged.py). A task's job id names its
  shard, so the detail page and the actions read and change each task there.
- Nothing can be added or edited; deleting is off unless a subclass sets `allow_delete = True`
  (then Django's delete permission applies). View-only staff can look and change nothing.
"""

from django.contrib import admin
from django.db.models import Q
from django.urls import path

from timeouts.admin import businesses, display
from timeouts.admin.actions import cancel_selected, requeue_selected, run_now
from timeouts.admin.filters import BizTypeFilter, DueWindowFilter, EndedLateFilter, ShardFilter, StatusFilter
from timeouts.admin.merged import ShardedChangeList
from timeouts.admin.paginator import EstimatedCountPaginator
from timeouts.models import TimeoutTask
from timeouts.storage import shards

MAX_JOB_ID = 2**63 - 1


@admin.register(TimeoutTask)
class TimeoutTaskAdmin(admin.ModelAdmin):
    list_display = ("job_id", "biz_type", "biz_id", "status_display", "action_time_display", "lateness_display",
                    "attempts")
    list_filter = (StatusFilter, BizTypeFilter, DueWindowFilter, EndedLateFilter)
    search_fields = ("=job_id", "=biz_id")  # for the search box; get_search_results does the lookups
    search_help_text = "Exact job id or biz_id."
    ordering = ("-action_time",)
    sortable_by = ("action_time_display",)
    list_per_page = 100
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = (cancel_selected, requeue_selected, run_now)
    allow_delete = False

    fieldsets = (
        (None, {"fields": ("job_id", "biz_type", "biz_id", "status_display", "action_time_display",
                           "run_at_display", "lateness_display")}),
        ("Attribute", {"fields": ("attribute_display",)}),
        ("Attempts", {"fields": ("attempts_display", "ttr", "lease_until_display", "last_error_display")}),
        ("Timestamps", {"fields": ("created_at_display", "modified_at_display", "dispatched_at_display",
                                   "started_at_display", "finished_at_display")}),
    )
    readonly_fields = tuple(name for _, options in fieldsets for name in options["fields"])

    # --- permissions -----------------------------------------------------------------------------

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # the state machine's internals are not edited by hand: actions change tasks

    def has_delete_permission(self, request, obj=None):
        return self.allow_delete and super().has_delete_permission(request, obj)

    def has_cancel_permission(self, request):
        return request.user.has_perm(f"{self.opts.app_label}.cancel_timeouttask")

    def has_requeue_permission(self, request):
        return request.user.has_perm(f"{self.opts.app_label}.requeue_timeouttask")

    # --- the businesses page --------------------------------------------------------------------

    def get_urls(self):
        page = self.admin_site.admin_view(lambda request: businesses.businesses_view(self, request))
        name = f"{self.opts.app_label}_{self.opts.model_name}_businesses"
        return [path("businesses/", page, name=name), *super().get_urls()]

    # --- the changelist --------------------------------------------------------------------------

    def get_changelist(self, request, **kwargs):
        return ShardedChangeList

    def get_list_filter(self, request):
        if len(shards.aliases()) > 1:
            return (ShardFilter, *self.list_filter)
        return self.list_filter

    def get_search_results(self, request, queryset, search_term):
        # Across shards every shard runs this condition: a biz_id may be on any of them (a
        # SHARD_ROUTER may place it by its biz_type too), and a job id is found on its own.
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(biz_id=term)
        job_id = _job_id(term)
        if job_id is not None:
            condition |= Q(job_id=job_id)
        return queryset.filter(condition), False

    @admin.display(description="status")
    def status_display(self, task):
        return display.status_badge(task)

    @admin.display(description="lateness")
    def lateness_display(self, task):
        return display.lateness(task)

    # --- the detail page -------------------------------------------------------------------------

    def get_object(self, request, object_id, from_field=None):
        job_id = _job_id(object_id)
        if from_field is not None or job_id is None or len(shards.aliases()) == 1:
            return super().get_object(request, object_id, from_field)
        try:  # on the shard the job id names
            return self.get_queryset(request).using(shards.alias_of_job(job_id)).get(job_id=job_id)
        except TimeoutTask.DoesNotExist:
            return None

    @admin.display(description="attribute")
    def attribute_display(self, task):
        return display.attribute_json(task)

    @admin.display(description="attempts")
    def attempts_display(self, task):
        return display.attempts(task)

    @admin.display(description="last error")
    def last_error_display(self, task):
        return display.last_error(task)


def _job_id(text):
    """`text` as a job id, or None."""
    if text.isascii() and text.isdigit() and int(text) <= MAX_JOB_ID:
        return int(text)
    return None


def _timestamp(name):
    @admin.display(description=name.replace("_", " "), ordering=name if name == "action_time" else None)
    def show(self, task):
        return display.moment(getattr(task, name))

    return show


# Timestamps to the millisecond (Django's default format stops at the minute).
for _name in ("action_time", "run_at", "lease_until", "created_at", "modified_at", "dispatched_at", "started_at",
              "finished_at"):
    setattr(TimeoutTaskAdmin, f"{_name}_display", _timestamp(_name))
