"""The oracle's checker: `check(sut_dsn, oracle_dsn, recovery_window=...) -> Report`.

It reads the system's `timeouts_task` rows and the oracle's tables (tests/reliability/oracle.py) and
lists every broken guarantee. Definitions (a "run" is one recorded handler start):

- committed: scheduled with outcome `committed`, or `unknown` and present in the system's table.
- lost: committed, no True cancel (nor an unknown cancel of a row now CANCELLED), never ran, and
  either missing from the system's table or due (run_at) more than `recovery_window` seconds ago.
  Committed tasks not due yet by that rule are only counted (`waiting`).
- unexpected: runs of jobs that never committed (rolled back, unknown and absent, or never recorded).
- ran_after_true_cancel: runs recorded after a cancel of that job returned True.
- early: runs whose oracle time (or compare-and-set time) is before the task's action_time or run_at
  as the compare-and-set returned them, or before the row's final action_time.
- double_starts: the same (job_id, attempt) recorded twice, or more runs than the row's final
  `attempts`. The compare-and-set must make these impossible whatever the faults (a requeue, which
  resets attempts, is the only legitimate cause of the second kind).
- duplicates: handler runs beyond the first per job, not counting retries after runs that failed on
  purpose (recorded with intent 'raise' or 'crash'). Crashes may cause some (at least once); without
  faults there must be none.
- stuck: rows still PENDING, DISPATCHED or RUNNING whose run_at is more than `recovery_window`
  seconds ago.
- accounting: DONE rows whose recorded runs != attempts; DEAD rows whose attempts != max_attempts.

`Report.assert_clean(max_duplicates=0, ignore=())` raises AssertionError (with the report) when any
list but `duplicates` is non-empty, or duplicates exceed `max_duplicates`; `ignore` names lists a
scenario expects to be non-empty (e.g. ("accounting",) when a process may die between the
compare-and-set and the handler's first line).
"""

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

import psycopg
from psycopg.rows import dict_row

from timeouts.states import Status

STATUS_NAMES = {status: status.name for status in Status}
FAILING_INTENTS = ("raise", "crash")
PROBLEMS = ("lost", "unexpected", "ran_after_true_cancel", "early", "double_starts", "duplicates", "stuck",
            "accounting")


@dataclass
class Report:
    counts: dict = field(default_factory=dict)
    lost: list = field(default_factory=list)  # job ids
    unexpected: list = field(default_factory=list)  # job ids
    ran_after_true_cancel: list = field(default_factory=list)  # job ids
    early: list = field(default_factory=list)  # (job_id, attempt, seconds early)
    double_starts: list = field(default_factory=list)  # (job_id, what)
    duplicates: list = field(default_factory=list)  # (job_id, extra runs)
    stuck: list = field(default_factory=list)  # (job_id, status name, seconds overdue)
    accounting: list = field(default_factory=list)  # (job_id, what)
    runs_by_job: dict = field(default_factory=dict)  # job_id -> [run dicts, oldest first]
    first_lateness: dict = field(default_factory=dict)  # job_id -> seconds, first run's ran_at - action_time

    @property
    def duplicate_runs(self) -> int:
        return sum(extra for _job, extra in self.duplicates)

    def problems(self) -> dict:
        return {name: getattr(self, name) for name in PROBLEMS if getattr(self, name)}

    def max_lateness(self) -> float:
        return max(self.first_lateness.values(), default=0.0)

    def __str__(self):
        lines = ["oracle report: " + ", ".join(f"{key} {value}" for key, value in self.counts.items())]
        if self.first_lateness:
            lines.append(f"  first-run lateness: max {self.max_lateness():.3f} s over {len(self.first_lateness)} jobs")
        for name, items in self.problems().items():
            total = f" ({self.duplicate_runs} extra runs)" if name == "duplicates" else ""
            lines.append(f"  {name}: {len(items)}{total}: {items[:10]}{' ...' if len(items) > 10 else ''}")
        if not self.problems():
            lines.append("  no problems")
        return "\n".join(lines)

    def unstarted_attempts(self) -> int:
        """Asserts that every accounting entry is an attempt that counted and never reached the
        handler (DONE after n attempts, fewer runs recorded): a compare-and-set committed and its reply
        was lost, or its process died before the handler's first line. More runs than attempts would
        break the fence. Returns how many there are."""
        for job_id, what in self.accounting:
            match = re.match(r"DONE after (\d+) attempts, (\d+) runs recorded", what)
            assert match and int(match[2]) < int(match[1]), f"job {job_id}: {what}\n{self}"
        return len(self.accounting)

    def assert_clean(self, max_duplicates=0, ignore=()):
        failing = {name: items for name, items in self.problems().items() if name not in ignore}
        if "duplicates" in failing and self.duplicate_runs <= max_duplicates:
            del failing["duplicates"]
        assert not failing, f"broken guarantees: {sorted(failing)}\n{self}"


def check(sut_dsn, oracle_dsn, *, recovery_window) -> Report:
    with psycopg.connect(sut_dsn, row_factory=dict_row, connect_timeout=10) as sut:
        now = sut.execute("SELECT clock_timestamp() AS now").fetchone()["now"]
        rows = {row["job_id"]: row for row in sut.execute(
            "SELECT job_id, status, action_time, run_at, attempts, max_attempts FROM timeouts_task")}
    with psycopg.connect(oracle_dsn, row_factory=dict_row, connect_timeout=10) as oracle:
        scheduled = oracle.execute("SELECT job_id, outcome FROM oracle_scheduled").fetchall()
        cancels = oracle.execute("SELECT job_id, result, cancelled_at FROM oracle_cancel").fetchall()
        runs = oracle.execute("SELECT * FROM oracle_run ORDER BY ran_at").fetchall()
    return _compare(rows, scheduled, cancels, runs, now, timedelta(seconds=recovery_window))


def _compare(rows, scheduled, cancels, runs, now, window) -> Report:
    outcomes = Counter(entry["outcome"] for entry in scheduled)
    committed = {e["job_id"] for e in scheduled
                 if e["outcome"] == "committed" or (e["outcome"] == "unknown" and e["job_id"] in rows)}
    true_cancels = {}
    for entry in cancels:
        cancelled = rows.get(entry["job_id"], {}).get("status") == Status.CANCELLED
        if entry["result"] or (entry["result"] is None and cancelled):
            true_cancels.setdefault(entry["job_id"], entry["cancelled_at"])
    by_job = defaultdict(list)
    for run in runs:
        by_job[run["job_id"]].append(run)

    report = Report(runs_by_job=dict(by_job))
    waiting = 0
    for job_id in sorted(committed - set(true_cancels) - set(by_job)):
        row = rows.get(job_id)
        if row is None or row["run_at"] <= now - window:
            report.lost.append(job_id)
        else:
            waiting += 1
    report.unexpected = sorted(set(by_job) - committed)
    for job_id, job_runs in sorted(by_job.items()):
        _check_runs(report, job_id, job_runs, rows.get(job_id), true_cancels.get(job_id))
    for job_id, row in sorted(rows.items()):
        _check_row(report, job_id, row, len(by_job.get(job_id, ())), now, window)
    statuses = Counter(STATUS_NAMES[row["status"]].lower() for row in rows.values())
    report.counts = {"scheduled": len(scheduled), "committed": len(committed), "rolled back": outcomes["rolled_back"],
                     "unknown": outcomes["unknown"], "true cancels": len(true_cancels), "runs": len(runs),
                     "jobs run": len(by_job), "waiting": waiting, **dict(sorted(statuses.items()))}
    return report


def _check_runs(report, job_id, job_runs, row, cancelled_at):
    if cancelled_at is not None and any(run["ran_at"] > cancelled_at for run in job_runs):
        report.ran_after_true_cancel.append(job_id)
    for run in job_runs:
        due = max(run["action_time"], run["run_at"], row["action_time"] if row else run["action_time"])
        started = min(run["ran_at"], run["started_at"] or run["ran_at"])
        if started < due:
            report.early.append((job_id, run["attempt"], round((due - started).total_seconds(), 6)))
    for attempt, count in Counter(run["attempt"] for run in job_runs).items():
        if count > 1:
            report.double_starts.append((job_id, f"attempt {attempt} started {count} times"))
    if row is not None and len(job_runs) > row["attempts"]:
        report.double_starts.append((job_id, f"{len(job_runs)} runs but attempts = {row['attempts']}"))
    failed_on_purpose = sum(run["intent"] in FAILING_INTENTS for run in job_runs)
    extra = len(job_runs) - 1 - failed_on_purpose
    if extra > 0:
        report.duplicates.append((job_id, extra))
    report.first_lateness[job_id] = (job_runs[0]["ran_at"] - job_runs[0]["action_time"]).total_seconds()


def _check_row(report, job_id, row, run_count, now, window):
    status = row["status"]
    if status in (Status.PENDING, Status.DISPATCHED, Status.RUNNING) and row["run_at"] <= now - window:
        report.stuck.append((job_id, STATUS_NAMES[status], round((now - row["run_at"]).total_seconds(), 1)))
    if status == Status.DONE and run_count != row["attempts"]:
        report.accounting.append((job_id, f"DONE after {row['attempts']} attempts, {run_count} runs recorded"))
    if status == Status.DEAD and row["attempts"] != row["max_attempts"]:
        report.accounting.append((job_id, f"DEAD after {row['attempts']} of {row['max_attempts']} attempts"))
