"""Fault points for reliability tests: crash, stall or fail a process at a named step.

Arm points through the environment of the process under test (read once, at import):

    TIMEOUTS_FAULTS="claim.after_commit=exit"
    TIMEOUTS_FAULTS="publish.after_send=raise@0.3,run.before_done=sleep:2#3"
    TIMEOUTS_FAULTS_LOG=/tmp/faults.log   # optional: one line "pid point action" per firing

Syntax: comma-separated `point=action[rule]`.

- actions: `exit` (os._exit(137) at once: no cleanup, no rollback sent, like kill -9),
  `raise` (raise FaultInjected, a RuntimeError), `sleep:<seconds>` (then carry on).
- rule (optional): `@<p>` fires with probability p (0 < p <= 1); `#<n>` fires only on the n-th hit
  of that point in this process; `#<n>+` on the n-th hit and every later one. Without a rule the
  point fires on every hit.

Points (where the code calls `fault(point)`):

- `claim.before_commit`: a claim's UPDATE ran, its transaction is not committed yet (when armed,
  and only then, claim_due runs its statement inside transaction.atomic() to have that moment)
- `claim.after_commit`: a claim committed, nothing published yet (fires only for non-empty claims)
- `publish.after_send`: a message reached the broker; publish() has not counted it as sent
- `run.after_start`: the worker's compare-and-set committed, the handler has not started
- `run.before_done`: the handler returned, the DONE mark is not written yet
- `run.after_done`: the DONE mark committed, `timeouts.run` has not returned

Unarmed (TIMEOUTS_FAULTS unset or empty), `fault()` is one falsy dict check: free in production.
"""

import os
import random
import threading
import time

POINTS = frozenset({
    "claim.before_commit", "claim.after_commit", "publish.after_send",
    "run.after_start", "run.before_done", "run.after_done",
})
EXIT_STATUS = 137  # what a shell reports for a process killed by SIGKILL


class FaultInjected(RuntimeError):
    """Raised by a fault point armed with the `raise` action."""


class Fault:
    def __init__(self, point, action, seconds=0.0, probability=None, nth=None, onwards=False):
        self.point, self.action, self.seconds = point, action, seconds
        self.probability, self.nth, self.onwards = probability, nth, onwards
        self.hits = 0
        self.lock = threading.Lock()

    def should_fire(self) -> bool:
        with self.lock:
            self.hits += 1
            hit = self.hits
        if self.nth is not None:
            return hit >= self.nth if self.onwards else hit == self.nth
        if self.probability is not None:
            return random.random() < self.probability
        return True

    def describe(self) -> str:
        return f"sleep:{self.seconds:g}" if self.action == "sleep" else self.action


def parse(text: str) -> dict[str, Fault]:
    """`"point=action[@p|#n|#n+], ..."` -> {point: Fault}. Raises ValueError on anything unknown."""
    faults = {}
    for item in (part.strip() for part in (text or "").split(",")):
        if not item:
            continue
        point, sep, spec = item.partition("=")
        point, spec = point.strip(), spec.strip()
        if not sep or point not in POINTS:
            raise ValueError(f"TIMEOUTS_FAULTS: unknown fault point in {item!r}; points: {sorted(POINTS)}")
        if point in faults:
            raise ValueError(f"TIMEOUTS_FAULTS: point {point!r} armed twice")
        faults[point] = _parse_spec(point, spec, item)
    return faults


def _parse_spec(point, spec, item) -> Fault:
    rule = {}
    if "@" in spec:
        spec, probability = spec.split("@", 1)
        rule["probability"] = _number(float, probability, item)
        if not 0 < rule["probability"] <= 1:
            raise ValueError(f"TIMEOUTS_FAULTS: probability must be in (0, 1] in {item!r}")
    elif "#" in spec:
        spec, nth = spec.split("#", 1)
        rule["onwards"] = nth.endswith("+")
        rule["nth"] = _number(int, nth.rstrip("+"), item)
        if rule["nth"] < 1:
            raise ValueError(f"TIMEOUTS_FAULTS: hits count from 1 in {item!r}")
    action, _, argument = spec.partition(":")
    if action in ("exit", "raise") and not argument:
        return Fault(point, action, **rule)
    if action == "sleep" and argument:
        return Fault(point, "sleep", seconds=_number(float, argument, item), **rule)
    raise ValueError(f"TIMEOUTS_FAULTS: unknown action in {item!r}; actions: exit, raise, sleep:<seconds>")


def _number(kind, text, item):
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"TIMEOUTS_FAULTS: bad number {text!r} in {item!r}") from None


def _log(fault_: Fault):
    path = os.environ.get("TIMEOUTS_FAULTS_LOG")
    if path:
        # One short append per firing: lines from several processes never interleave mid-line.
        with open(path, "a") as log:
            log.write(f"{os.getpid()} {fault_.point} {fault_.describe()}\n")


ARMED: dict[str, Fault] = parse(os.environ.get("TIMEOUTS_FAULTS", ""))


def armed(point: str) -> bool:
    return point in ARMED


def fault(point: str):
    """Fire the fault armed at `point`, if any (and if its rule says so)."""
    if not ARMED:
        return
    fault_ = ARMED.get(point)
    if fault_ is None or not fault_.should_fire():
        return
    _log(fault_)
    if fault_.action == "exit":
        os._exit(EXIT_STATUS)
    if fault_.action == "raise":
        raise FaultInjected(f"fault injected at {point}")
    time.sleep(fault_.seconds)


def fired(log_path, point=None) -> list[tuple[int, str, str]]:
    """The firings recorded in a TIMEOUTS_FAULTS_LOG file: [(pid, point, action)], for tests."""
    try:
        with open(log_path) as log:
            lines = [line.split() for line in log if line.strip()]
    except FileNotFoundError:
        return []
    return [(int(pid), name, action) for pid, name, action in lines if point is None or name == point]
