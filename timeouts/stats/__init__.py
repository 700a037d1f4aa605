"""Cheap numbers about the task table, for the admin, `manage.py timeouts_stats` and the metrics.

The table may hold tens of millions of rows, so nothing here counts a large set row by row:
counting.py counts exactly while that is cheap, else answers with the planner's estimate;
whole_table.py has the table's numbers, per_biz_type.py each biz_type's, time_buckets.py the
businesses page's charts; database_report.py is timeouts_stats's report of one database,
shard_totals.py of several, text_report.py writes it out, and units.py writes sizes and durations.
The queries are in sql/queries/stats.sql; the admin's counts are its filters' querysets.

The names below are importable from here. A limit is read where it is defined: to change one (in a
test), set it on its module.
"""

from timeouts.stats.counting import EXACT_LIMIT, MAX_COST, Count, bounded_count, count, estimated_rows, plan
from timeouts.stats.database_report import report
from timeouts.stats.per_biz_type import (
    BIZ_TYPES_LIMIT,
    OVERDUE_LIMIT,
    RUNNING_LIMIT,
    BizType,
    BizTypeLimits,
    biz_types,
    counting_in_index_order,
    overdue_by_biz_type,
    running_by_biz_type,
    stored_limits,
    waiting_biz_types,
)
from timeouts.stats.time_buckets import PER_BIZ_TYPE_LIMIT, Buckets, due_soon, recent_lateness
from timeouts.stats.units import human_bytes, seconds
from timeouts.stats.whole_table import (
    EXACT_TABLE_ROWS,
    INDEXED_STATUSES,
    SAMPLE_ROWS,
    SMALL_GROUP_LIMIT,
    default_rows,
    lateness,
    oldest_overdue,
    overdue,
    partition_sizes,
    pending,
    status_counts,
)

__all__ = [
    "EXACT_LIMIT", "MAX_COST", "Count", "bounded_count", "count", "estimated_rows", "plan",
    "report",
    "BIZ_TYPES_LIMIT", "OVERDUE_LIMIT", "RUNNING_LIMIT", "BizType", "BizTypeLimits", "biz_types",
    "counting_in_index_order", "overdue_by_biz_type", "running_by_biz_type", "stored_limits", "waiting_biz_types",
    "PER_BIZ_TYPE_LIMIT", "Buckets", "due_soon", "recent_lateness",
    "human_bytes", "seconds",
    "EXACT_TABLE_ROWS", "INDEXED_STATUSES", "SAMPLE_ROWS", "SMALL_GROUP_LIMIT", "default_rows", "lateness",
    "oldest_overdue", "overdue", "partition_sizes", "pending", "status_counts",
]
