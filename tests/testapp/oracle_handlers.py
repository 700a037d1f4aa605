"""Handlers for the reliability scenarios (tests/reliability): each records its run in the oracle
(tests/reliability/oracle.py, through TIMEOUTS_ORACLE_DSN) before doing anything else.

- oracle.ok: records and returns.
- oracle.slow: records, then sleeps attribute["sleep"] seconds (default 1), on every attempt, or only
  on the attempts listed in attribute["sleep_attempts"].
- oracle.flaky: records, then raises on the attempts listed in attribute["fail_attempts"].
- oracle.poison: records, then kills its own process (os._exit), on every attempt.

Small TTRs, so lease recovery (and "fired within TTR + SCAN_INTERVAL") takes seconds in a test.
"""

import os
import time

import timeouts
from tests.reliability.oracle import record_run

OK_TTR = 5
SLOW_TTR = 10
POISON_TTR = 2
MAX_ATTEMPTS = 5
POISON_MAX_ATTEMPTS = 3


@timeouts.handler("oracle.ok", max_attempts=MAX_ATTEMPTS, ttr=OK_TTR)
def ok(task):
    record_run(task)


@timeouts.handler("oracle.slow", max_attempts=MAX_ATTEMPTS, ttr=SLOW_TTR)
def slow(task):
    record_run(task)
    attempts = task.attribute.get("sleep_attempts")
    if attempts is None or task.attempts in attempts:
        time.sleep(float(task.attribute.get("sleep", 1)))


@timeouts.handler("oracle.flaky", max_attempts=MAX_ATTEMPTS, ttr=OK_TTR)
def flaky(task):
    failing = task.attempts in task.attribute.get("fail_attempts", ())
    record_run(task, intent="raise" if failing else "ok")
    if failing:
        raise RuntimeError(f"oracle.flaky fails attempt {task.attempts} on purpose")


@timeouts.handler("oracle.poison", max_attempts=POISON_MAX_ATTEMPTS, ttr=POISON_TTR)
def poison(task):
    record_run(task, intent="crash")
    os._exit(1)
