"""The changelist across shards: when TIMEOUTS["SHARDS"] names several databases and the shard
filter says "all shards", the page is the merge of every shard's first rows.

Django's ChangeList pages one queryset, and a queryset reads one database. So each shard runs the
same query (the filters, the search, the order), LIMITed to the rows up to the end of the page
asked for, and the rows are merged in Python in the changelist's order; the count is the sum of
each shard's count (exact or estimated, as paginator.py counts one). The paginator offers at most
100 pages, so a shard never reads more than 100 pages' worth of rows.

A shard that cannot be read (down, unreachable) leaves its rows out; the page says which.
"""

import logging
from operator import attrgetter

from django.contrib import messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import InvalidPage
from django.db import DatabaseError
from django.db.models import F, OrderBy

from timeouts import stats
from timeouts.storage import shards

logger = logging.getLogger(__name__)


def across_shards(queryset) -> bool:
    """True for a queryset that reads no database in particular while there are several shards:
    its rows may be on any of them. (The shard filter, or a caller, pins one with .using().)"""
    return queryset._db is None and len(shards.aliases()) > 1


class ShardMerge:
    """The rows of `queryset` on every shard (or on `aliases`), in its order: a sequence the
    paginator can count (total()) and slice."""

    def __init__(self, queryset, aliases=None):
        aliases = shards.aliases() if aliases is None else aliases
        self.querysets = {alias: queryset.using(alias) for alias in aliases}
        self.order_by = queryset.query.order_by
        self.unreadable = {}  # alias -> the error that kept it from being read

    def read(self, how) -> dict:
        """{alias: how(that shard's queryset)} for every shard that can be read. A shard that fails
        once is noted in `unreadable` and not asked again (its connection may be in a failed
        transaction)."""
        results = {}
        for alias, queryset in self.querysets.items():
            if alias in self.unreadable:
                continue
            try:
                results[alias] = how(queryset)
            except DatabaseError as error:
                logger.warning("timeouts admin: the shard %r could not be read", alias, exc_info=True)
                self.unreadable[alias] = error
        return results

    def total(self, count) -> stats.Count:
        """The sum of `count(queryset)` (a stats.Count) over the shards: exact if each one is."""
        counts = self.read(count).values()
        return stats.Count(sum(c.value for c in counts), all(c.exact for c in counts))

    def __getitem__(self, item):
        if not isinstance(item, slice) or item.step is not None:
            raise TypeError("a ShardMerge is only sliced, by a paginator")
        # The rows of [start:stop] of the merge are among each shard's first `stop`.
        rows = [task for tasks in self.read(lambda queryset: list(queryset[: item.stop])).values() for task in tasks]
        # The last key first: Python's sort is stable (reversed too), so earlier keys win.
        for name, descending in reversed([_field_and_direction(key) for key in self.order_by]):
            rows.sort(key=attrgetter(name), reverse=descending)
        return rows[item]


def _field_and_direction(key):
    """("action_time", True) for "-action_time" (the changelist's ordering is field names)."""
    if isinstance(key, str):
        return key.lstrip("-"), key.startswith("-")
    if isinstance(key, OrderBy) and isinstance(key.expression, F):
        return key.expression.name, key.descending
    raise ValueError(f"the admin cannot merge the shards' rows ordered by {key!r}")


class ShardedChangeList(ChangeList):
    """Django's ChangeList, except that across shards get_results() pages a ShardMerge. The rest of
    Django's changelist (filters, search, ordering, the actions' queryset) builds the one queryset
    that each shard runs."""

    def get_results(self, request):
        if not across_shards(self.queryset):
            return super().get_results(request)
        merged = ShardMerge(self.queryset)
        # As Django's get_results(), with the merge for the queryset and no full count (which would
        # be a COUNT(*) of every shard).
        paginator = self.model_admin.get_paginator(request, merged, self.list_per_page)
        self.result_count = paginator.count
        self.can_show_all = self.result_count <= self.list_max_show_all
        self.multi_page = self.result_count > self.list_per_page
        if (self.show_all and self.can_show_all) or not self.multi_page:
            self.result_list = merged[: self.result_count]
        else:
            try:
                self.result_list = paginator.page(self.page_num).object_list
            except InvalidPage:
                raise IncorrectLookupParameters from None
        self.paginator = paginator
        self.full_result_count = None
        self.show_full_result_count = False
        self.show_admin_actions = True
        if request.method != "GET":
            return  # an action's POST: Django redirects to the page, whose GET says it
        for alias, error in merged.unreadable.items():
            messages.warning(request, f"The shard {alias!r} could not be read ({type(error).__name__}): "
                                      "its tasks are not in this list.")
