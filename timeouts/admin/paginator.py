"""A paginator that never counts a large result row by row.

Django's changelist asks its paginator for `count` on every page view; the stock one runs
SELECT COUNT(*) over everything the filters match, which on tens of millions of rows takes
seconds. This one counts exactly up to `exact_limit` rows when that is cheap and otherwise uses
the planner's estimate (see timeouts.stats.count), and offers at most `max_pages` pages: deeper
pages would be OFFSET scans over hundreds of thousands of rows, and filtering or reversing the
order finds the same rows faster. Across shards (merged.py) the count is the sum of each shard's.
"""

import math

from django.core.paginator import Paginator
from django.utils.functional import cached_property

from timeouts import stats
from timeouts.admin.merged import ShardMerge


class EstimatedCountPaginator(Paginator):
    exact_limit = stats.EXACT_LIMIT
    max_pages = 100

    @cached_property
    def counted(self) -> stats.Count:
        if isinstance(self.object_list, ShardMerge):
            return self.object_list.total(lambda queryset: stats.count(queryset, exact_limit=self.exact_limit))
        return stats.count(self.object_list, exact_limit=self.exact_limit)

    @cached_property
    def count(self):
        counted = self.counted
        if counted.exact:
            return counted.value
        # Never below the exact range when estimated: the changelist then always pages with
        # LIMIT (it fetches everything at once when the count is below list_per_page or
        # list_max_show_all, and an estimate can be too low).
        return max(counted.value, self.exact_limit + 1)

    @property
    def count_is_exact(self) -> bool:
        return self.counted.exact

    @cached_property
    def num_pages(self):
        if self.count == 0 and not self.allow_empty_first_page:
            return 0
        hits = max(1, self.count - self.orphans)
        return min(math.ceil(hits / self.per_page), self.max_pages)

    @property
    def pages_capped(self) -> bool:
        return math.ceil(max(1, self.count - self.orphans) / self.per_page) > self.max_pages

    @property
    def count_note(self) -> str:
        note = (f"The count is an estimate from the table's statistics (more than {self.exact_limit:,} tasks "
                "match; counting them exactly would read them all).")
        if self.pages_capped:
            note += f" Only the first {self.max_pages} pages are offered: filter, search or reverse the order."
        return note
