"""`TimeoutTask`: one row per "at this time, run this handler for this business object".

The table itself is created by SQL (sql/migrations/0001_tasks.sql): it is partitioned by
action_time, its database key is (job_id, action_time), and CHECK constraints hold the state rules.
Django sees `job_id` as the primary key, which is unique on its own, across shards too (shards.py).
"""

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from functools import cache
from typing import Any
from uuid import UUID

from django.db import connection, models
from django.db.models.base import ModelState
from django.db.models.functions import Now
from django.db.models.signals import post_init, pre_init

from timeouts.states import Status
from timeouts.store import scheduling, transitions
from timeouts.validation import DEFAULT_ON_CONFLICT, EMPTY_ATTRIBUTE

__all__ = ["TimeoutTask", "TimeoutTaskManager", "TimeoutTaskQuerySet"]


class TimeoutTaskQuerySet(models.QuerySet["TimeoutTask"]):
    def pending(self) -> "TimeoutTaskQuerySet":
        """Tasks waiting for their time (or for their next attempt after a failure)."""
        return self.filter(status=TimeoutTask.Status.PENDING)

    def due(self) -> "TimeoutTaskQuerySet":
        """PENDING tasks whose time has come by the database clock (the statement's start)."""
        now = Now()
        # action_time is implied by run_at (run_at >= action_time) but lets PostgreSQL skip future
        # partitions.
        return self.pending().filter(run_at__lte=now, action_time__lte=now)

    def dead(self) -> "TimeoutTaskQuerySet":
        """Tasks whose handler failed max_attempts times: they wait for an operator's requeue()."""
        return self.filter(status=TimeoutTask.Status.DEAD)


# Named first, then subclassed: the form that django-stubs' plugin types (a host's mypy then sees
# the queryset's methods on the manager).
_TimeoutTaskManagerBase = models.Manager.from_queryset(TimeoutTaskQuerySet)


class TimeoutTaskManager(_TimeoutTaskManagerBase):
    # The writes go to the shard of the task's (biz_type, biz_id) (shards.py), unless the manager
    # was given a database (`TimeoutTask.objects.db_manager(alias)`).
    def schedule(self, biz_type: str, biz_id: str | int | UUID, *, at: datetime | None = None,
                 delay: timedelta | float | None = None, attribute: Mapping[str, Any] | None = None,
                 on_conflict: str | None = DEFAULT_ON_CONFLICT, max_wait: timedelta | None = None) -> "TimeoutTask":
        """`timeouts.schedule()` on this manager's database, if it was given one."""
        return scheduling.schedule(self.model, biz_type, biz_id, at=at, delay=delay, attribute=attribute,
                                   on_conflict=on_conflict, max_wait=max_wait, using=self._db)

    def bulk_schedule(self, items: Iterable[Mapping[str, Any]]) -> int:
        """`timeouts.bulk_schedule()` on this manager's database, if it was given one."""
        return scheduling.bulk_schedule(self.model, items, using=self._db)

    def cancel(self, biz_type: str, biz_id: str | int | UUID) -> int:
        """Cancel every task of (biz_type, biz_id) that has not started, and discard its DEAD ones;
        returns how many ended (`timeouts.cancel()` answers instead whether a handler was stopped).
        A biz_type with no handler (a typo) raises UnknownBizType, as schedule() does."""
        count, _stopped = transitions.cancel_by_key(biz_type, biz_id, using=self._db)
        return count


class TimeoutTask(models.Model):
    Status = Status

    job_id = models.BigAutoField(primary_key=True)
    biz_type = models.CharField(max_length=64)
    biz_id = models.CharField(max_length=255)
    status = models.SmallIntegerField(choices=Status.choices, default=Status.PENDING)
    action_time = models.DateTimeField(help_text="When the task becomes due (UTC).")
    run_at = models.DateTimeField(help_text="When the next attempt may start: action_time, or later after a retry.")
    attribute = models.JSONField(default=dict, blank=True)
    attempts = models.IntegerField(default=0)
    max_attempts = models.IntegerField()
    ttr = models.IntegerField(help_text="Seconds a claimed or running task may go silent before it is re-dispatched.")
    last_error = models.TextField(blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    modified_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = TimeoutTaskManager()

    class Meta:
        db_table = "timeouts_task"
        verbose_name = "timeout task"
        permissions = [
            ("cancel_timeouttask", "Can cancel timeout tasks and run them now"),
            ("requeue_timeouttask", "Can requeue dead or cancelled timeout tasks"),
            # Of a biz_type rather than of a task (timeouts.limiting.controls): pause(), resume(), set_limits().
            ("change_limits", "Can pause, resume and change the limits of a biz type"),
        ]

    def __str__(self) -> str:
        return f"{self.biz_type}:{self.biz_id} #{self.job_id} ({self.get_status_display()})"

    @property
    def lateness(self) -> timedelta | None:
        """How long after its action_time the task started (a timedelta), or None."""
        if self.started_at is None:
            return None
        return self.started_at - self.action_time

    def cancel(self) -> bool:
        """True only if the handler will never run for this task."""
        return transitions.cancel(self)

    def reschedule(self, *, at: datetime | None = None, delay: timedelta | float | None = None) -> bool:
        """Move a task that has not started to a new time; False if it already started or ended."""
        return transitions.reschedule(self, at=at, delay=delay)

    def requeue(self) -> bool:
        """Make a DEAD or CANCELLED task PENDING again, due now, with its attempts reset."""
        return transitions.requeue(self)

    # Rows come back from named SQL queries (RETURNING *), not from the ORM's compiler, so the field
    # converters (JSON) are applied here.
    @classmethod
    def _from_row(cls, row: dict, using="default"):
        task = cls()
        task._state.adding = False
        task._state.db = using
        task._apply_row(row)
        return task

    @classmethod
    def _inserted(cls, using, *, job_id, biz_type, biz_id, action_time, attribute, max_attempts, ttr, created_at):
        """The task schedule() has just inserted (`attribute` as the database returned it): every other
        column has its value for a new task. Built as the ORM builds a fetched row, every column in
        field order, which costs half of _from_row() on schedule()'s hot path; without Model.__init__()
        when nobody listens to its signals (test_api checks the task against a fetch)."""
        attribute = {} if attribute == EMPTY_ATTRIBUTE else cls._meta.get_field("attribute").from_db_value(
            attribute, None, connection)
        values = (job_id, biz_type, biz_id, cls.Status.PENDING, action_time, action_time, attribute, 0, max_attempts,
                  ttr, "", None, created_at, created_at, None, None, None)
        if pre_init.receivers or post_init.receivers:  # someone listens: through __init__(), which sends them
            return cls.from_db(using, None, values)
        # What __init__() does with no receiver of its signals and a value for every field: the state,
        # then each field's value under its attname (none has a descriptor that sets it).
        task = cls.__new__(cls)
        task._state = ModelState()
        task._state.adding = False
        task._state.db = using
        task.__dict__.update(zip(cls._attnames(), values, strict=True))
        return task

    @classmethod
    @cache
    def _attnames(cls) -> tuple[str, ...]:
        return tuple(field.attname for field in cls._meta.concrete_fields)

    def _apply_row(self, row: dict):
        for field in self._meta.concrete_fields:
            if field.column in row:
                value = row[field.column]
                if hasattr(field, "from_db_value"):
                    value = field.from_db_value(value, None, connection)
                setattr(self, field.attname, value)
