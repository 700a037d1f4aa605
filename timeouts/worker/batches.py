"""The worker side of `timeouts.run_batch`: tasks due together, run one after another.

Each task goes through `running.run()` as if it had come alone: its own compare-and-set (the
cancel fence, the early-start guard, the stale-message check), its own handler, its own DONE.
What a batch saves is Celery's cost per message, which is most of the cost of a quick handler, and
a statement per task: a handler's DONE is written in one statement with the next task's start
(`running.run_leaving_done`), or alone if the batch ends or has to wait long for its next task.

A batch must not hold its later tasks hostage behind a slow handler: once it has run for
`BUDGET` (protocol.py) seconds, it gives the tasks it has not started back (PENDING, with a NOTIFY), and a
dispatcher hands them to whichever worker is free; so does a batch that fails part way. A
backlog's batch that a task claimed on time waits for passes its unstarted tasks on, still
claimed, in a message of their own (on_time_first.py). Its tasks share one TTR, and Celery's time
limit on the message is TTR + BUDGET: each start extends its lease by what is left of the budget,
so every handler gets its whole TTR, and none outlives its lease.
"""

import logging
import time
from collections import Counter

from django.db import DEFAULT_DB_ALIAS

from timeouts.dispatch.claiming import release
from timeouts.protocol import BUDGET, from_batch_item
from timeouts.worker import attempt, running

logger = logging.getLogger(__name__)

# Seconds a batch may wait for its next task with the last handler's DONE unwritten. A shorter wait
# cannot hide a statement of its own on a loaded server: written alone, that DONE would make the
# next task late by a statement. A longer one writes it first, not to leave the task RUNNING (and
# counted against its biz_type's concurrency) while the worker waits.
DONE_WAITS_UP_TO = 0.005


def run_batch(items, give_way=None, shard=DEFAULT_DB_ALIAS) -> str:
    """Run the batch's tasks (of `shard`) in order; returns a summary of the outcomes. `give_way`, a
    backlog's batch's (on_time_first.GiveWay), is asked between two tasks whether a task claimed on
    time waits for this process: the batch then passes the rest on, and ends."""
    as_sent, items = items, [from_batch_item(item, shard) for item in items]
    began = time.monotonic()
    outcomes = Counter()
    done = None  # the last handler's DONE, which the next start writes (running.Done)
    for index, item in enumerate(items):
        if index and time.monotonic() - began > BUDGET:
            outcomes["released"] += _give_back(items[index:], f"the batch ran {time.monotonic() - began:.1f} s")
            break
        if index and give_way is not None and give_way.asked():
            outcomes.update(_pass_on(items[index:], as_sent[index:], give_way))
            break
        wait = item.run_at.timestamp() - time.time()
        if wait > 0:
            if done is not None and wait > DONE_WAITS_UP_TO:
                outcomes[running.finish(done)] += 1
                done = None
            _wait(wait)
        # The message's time limit is TTR + BUDGET from the batch's start: a lease of TTR plus what
        # is left of the budget lasts exactly as long, so no handler runs on after its lease.
        lease_extra = max(0.0, BUDGET - (time.monotonic() - began))
        try:
            previous_outcome, outcome, done = running.run_leaving_done(item, lease_extra, previous=done)
        except Exception:
            # The message fails and is acknowledged: without this, the tasks from this one on
            # (if it did not start) would wait out their claim's lease.
            _give_back(items[index:], "the batch failed")
            raise
        outcomes.update(filter(None, (previous_outcome, outcome)))
    if done is not None:
        outcomes[running.finish(done)] += 1
    return ", ".join(f"{count} {outcome}" for outcome, count in sorted(outcomes.items()))


def _pass_on(rest, rest_as_sent, give_way) -> dict:
    """Hand the unstarted tasks on in a message of their own (their items as this message carried
    them), or give them back if that fails."""
    try:
        give_way.pass_on(rest_as_sent)
    except Exception:
        logger.exception("timeouts: could not pass %d unstarted tasks on", len(rest))
        return {"released": _give_back(rest, "a task claimed on time waits")}
    return {"passed on": len(rest)}


def _give_back(rest, why) -> int:
    """Release the batch's unstarted tasks (PENDING, with a NOTIFY); returns how many."""
    if not rest:
        return 0
    try:
        release(rest)
    except Exception:  # the database may be what failed: their leases then run out
        logger.exception("timeouts: %s; could not give %d unstarted tasks back", why, len(rest))
        return 0
    logger.info("timeouts: %s; gave %d unstarted tasks back", why, len(rest))
    return len(rest)


def _wait(seconds: float):
    """Sleep until a task's run_at by the local clock (the message's ETA was a few milliseconds
    before the batch's first task: protocol.ETA_HEADROOM). The compare-and-set still decides by
    the database clock, and waits out any difference itself."""
    time.sleep(min(seconds, attempt.MAX_EARLY_WAIT))
