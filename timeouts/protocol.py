"""The message that carries a claimed task from the dispatcher to the worker: its fence, the three
wire forms it travels in, and the constants both sides share.

A claim becomes a message that names the row (job_id, action_time), the attempt it may start (the
compare-and-set's fence), the partition that held the row (so the worker's UPDATEs go straight
there) and the shard that holds it. It travels in one of four forms, all JSON:

- `timeouts.run`: args `[job_id, action_time, attempt, partition]`, kwargs `{"shard": shard}`
  (none for the default shard: a single database's messages name none);
- one item of `timeouts.run_batch`'s list: `[job_id, action_time, attempt, run_at, partition]`,
  the shard in the message's kwargs as above, run_at so the worker can wait for each task;
- a stored Celery call's own message (DurableTask): the header FENCE_HEADER holds
  `[job_id, action_time, attempt, partition, shard]`. The worker's main process appends the start
  it recorded ahead (durable/starts.py) before it hands the message to a pool process, which never
  leaves the worker. A four-field header (no shard) is the default shard's.
- one item of `timeouts.calls`' list: the message above of one stored call, as
  `[headers, properties, body]` (body: the call's `[args, kwargs, embed]`, decoded). Calls claimed
  together that share their routing travel in one such message; the worker unpacks each item into
  an ordinary request of the call's own task (durable/unpacking.py).

Only this module knows where each field sits. Times travel as ISO 8601 text.
"""

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS

# The Celery tasks that run claims, addressed by name: the worker side (tasks.py) defines them.
RUN = "timeouts.run"
RUN_BATCH = "timeouts.run_batch"
# The Celery task whose message carries several stored calls' own messages (durable/together.py).
CALLS = "timeouts.calls"
# The header of a stored Celery call's message that carries its row's fence.
FENCE_HEADER = "timeouts"

# Bounded: a scan must not hang on a broker that is down; unpublished claims are released instead.
RETRY_POLICY = {"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2, "interval_max": 0.5}
# Seconds a batch may run before it hands its unstarted tasks back: its message's time limit is
# TTR + BUDGET, and each start in it extends its lease by what is left of the budget.
BUDGET = 1.0
# How much before its first task's run_at a message claimed ahead is due by its Celery ETA. Celery's
# ETA timer (in the worker's main process) hands a message to a pool process a few milliseconds
# after its ETA; the headroom covers that delay, and the batch then sleeps until each run_at itself,
# to within a sleep's precision (docs: explanation/benchmarks). Never early: the compare-and-set
# refuses a start before run_at by the database clock.
ETA_HEADROOM = timedelta(milliseconds=4)
# A claim whose task was due longer ago than this when claimed is part of a backlog. Up to
# MAX_DISPATCHED tasks' worth of a backlog's messages wait in the broker for the workers, which
# take them in order: a task of another biz_type that falls due meanwhile, claimed on time, would
# wait behind all of them. So a backlog's messages go at a lower priority than those claimed on time,
# and pass nobody that is on time (docs: howto/isolation).
BACKLOG_AFTER = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class Fence:
    """One claimed attempt, as a message carries it."""

    job_id: int
    action_time: datetime
    attempt: int  # the attempt this message may start, and no other
    partition: str | None = None  # where the claim found the row
    shard: str = DEFAULT_DB_ALIAS  # the alias of the database that holds the row
    run_at: datetime | None = None  # carried by a batch's items only
    # A start recorded ahead by the worker's main process ({"row": ..., "not_before": ...}): it
    # travels from there to the pool process, never through a broker.
    started: dict | None = field(default=None, compare=False)

    @property
    def key(self) -> dict:
        """The row's primary key, as the named queries take it."""
        return {"job_id": self.job_id, "action_time": self.action_time}

    def with_started(self, started) -> "Fence":
        return replace(self, started=started)


# --- timeouts.run -----------------------------------------------------------------------------------

def run_args(fence: Fence) -> list:
    return [fence.job_id, fence.action_time.isoformat(), fence.attempt, fence.partition]


def run_kwargs(fence: Fence) -> dict:
    """A batch's kwargs too: all of a message's tasks are on one shard."""
    return {} if fence.shard == DEFAULT_DB_ALIAS else {"shard": fence.shard}


def from_run(job_id, action_time, attempt, partition, shard=DEFAULT_DB_ALIAS) -> Fence:
    """The fence of a `timeouts.run` message, from its args and kwargs as the task receives them."""
    return Fence(job_id, datetime.fromisoformat(action_time), attempt, partition, shard)


# --- timeouts.run_batch -----------------------------------------------------------------------------

def batch_item(fence: Fence) -> list:
    return [fence.job_id, fence.action_time.isoformat(), fence.attempt, fence.run_at.isoformat(), fence.partition]


def from_batch_item(item, shard=DEFAULT_DB_ALIAS) -> Fence:
    job_id, action_time, attempt, run_at, partition = item
    return Fence(job_id, datetime.fromisoformat(action_time), attempt, partition, shard, datetime.fromisoformat(run_at))


# --- A stored Celery call's header ------------------------------------------------------------------

def header(fence: Fence) -> list:
    """The FENCE_HEADER of the call's message; with the start recorded ahead, if there is one."""
    fields = [fence.job_id, fence.action_time.isoformat(), fence.attempt, fence.partition, fence.shard]
    return fields if fence.started is None else [*fields, fence.started]


def from_header(fields) -> Fence:
    job_id, action_time, attempt, partition, *rest = fields
    shard = rest[0] if rest else DEFAULT_DB_ALIAS
    started = rest[1] if len(rest) > 1 else None
    return Fence(job_id, datetime.fromisoformat(action_time), attempt, partition, shard, started=started)


# --- timeouts.calls ---------------------------------------------------------------------------------

def call_item(headers: dict, properties: dict, body) -> list:
    """One call of a `timeouts.calls` message: its own message's headers (with the fence), its
    properties (correlation_id, reply_to, priority) and its body `[args, kwargs, embed]`."""
    return [headers, properties, body]


def from_call_item(item) -> tuple[dict, dict, list]:
    """(headers, properties, body) of one item; ValueError for what is not one."""
    try:
        headers, properties, body = item
    except (TypeError, ValueError):
        raise ValueError(f"not an item of {CALLS}: {item!r:.200}") from None
    if not isinstance(headers, dict) or not isinstance(properties, dict) or not isinstance(body, list) \
            or len(body) != 3:
        raise ValueError(f"not an item of {CALLS}: {item!r:.200}")
    return headers, properties, body
