"""CPU time (user + system) of groups of processes, read from /proc, and what it costs per call.

Two kinds of group:

- a process tree (`Tree`): a process, or its children only, or the whole tree. A parent's stat
  line also carries the CPU time of the children it has reaped (cutime, cstime), so the tree's
  total, `tree_ticks`, is exact from one reading to the next even when a child (a pool process, a
  PostgreSQL backend, a Redis save) is born and ends in between.
- a set of processes found by asking (`Tracked`): the PostgreSQL backends of one database, listed
  by pg_stat_activity at each sample. One seen first after the start counts from its birth, one
  seen at the start from then; one that ends between two samples loses what it used since the
  last one (`gone` says how many did).

Times are in clock ticks, as /proc gives them; `seconds()` turns them into seconds.
"""

import os
from typing import NamedTuple

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ProcStat(NamedTuple):
    """The fields of /proc/<pid>/stat that CPU accounting reads (times in clock ticks)."""

    pid: int
    comm: str
    ppid: int
    utime: int
    stime: int
    cutime: int  # of the children this process has reaped
    cstime: int
    starttime: int  # ticks after boot


def parse_stat(line: str) -> ProcStat:
    """One /proc/<pid>/stat line. The command name sits in parentheses and may hold spaces and
    parentheses itself: the fields after it start after the last ')'."""
    head, _, tail = line.rpartition(")")
    pid_text, _, comm = head.partition(" (")
    fields = tail.split()
    # tail: state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime
    # cutime cstime priority nice num_threads itrealvalue starttime ...
    return ProcStat(pid=int(pid_text), comm=comm, ppid=int(fields[1]), utime=int(fields[11]),
                    stime=int(fields[12]), cutime=int(fields[13]), cstime=int(fields[14]),
                    starttime=int(fields[19]))


def read_stat(pid, proc="/proc") -> ProcStat | None:
    try:
        with open(f"{proc}/{pid}/stat") as f:
            return parse_stat(f.read())
    except (OSError, ValueError, IndexError):  # gone, or not ours to read
        return None


def process_table(proc="/proc") -> dict[int, ProcStat]:
    """Every process's stat line now: {pid: ProcStat}."""
    table = {}
    for name in os.listdir(proc):
        if name.isdigit():
            stat = read_stat(name, proc)
            if stat is not None:
                table[stat.pid] = stat
    return table


def uptime_ticks(proc="/proc") -> float:
    """Now, in clock ticks after boot (the clock of ProcStat.starttime)."""
    with open(f"{proc}/uptime") as f:
        return float(f.read().split()[0]) * TICKS_PER_SECOND


def own_ticks(stat: ProcStat) -> int:
    return stat.utime + stat.stime


def children_of(table, pid) -> list[ProcStat]:
    return [s for s in table.values() if s.ppid == pid]


def tree_ticks(table, pid) -> int | None:
    """The CPU time of `pid` and of every descendant, alive or reaped; None if `pid` is gone."""
    stat = table.get(pid)
    if stat is None:
        return None
    below = {}
    for s in table.values():
        below.setdefault(s.ppid, []).append(s)
    total, todo, seen = 0, [stat], set()
    while todo:
        s = todo.pop()
        if s.pid in seen:
            continue
        seen.add(s.pid)
        total += own_ticks(s) + s.cutime + s.cstime
        todo.extend(below.get(s.pid, ()))
    return total


def seconds(ticks) -> float | None:
    return None if ticks is None else ticks / TICKS_PER_SECOND


# --- groups ---------------------------------------------------------------------------------------

class Tree:
    """A process (`part="self"`), what it forked (`"children"`: alive and reaped), or both (`"all"`).
    The ticks used between start() and the last sample(); None if the process was gone at either."""

    PARTS = ("self", "children", "all")

    def __init__(self, pid, part="all"):
        if part not in self.PARTS:
            raise ValueError(f"part: one of {self.PARTS}, not {part!r}")
        self.pid, self.part = pid, part
        self.first = self.last = None

    def _now(self, table):
        stat, total = table.get(self.pid), tree_ticks(table, self.pid)
        if stat is None:
            return None
        return {"self": own_ticks(stat), "children": total - own_ticks(stat), "all": total}[self.part]

    def start(self, table, started):
        self.first = self.last = self._now(table)

    def sample(self, table):
        self.last = self._now(table)

    def ticks(self) -> int | None:
        return None if self.first is None or self.last is None else self.last - self.first


class Trees:
    """The sum of several Tree groups (the processes of a broker): None if none was found."""

    def __init__(self, pids, part="all"):
        self.trees = [Tree(pid, part) for pid in pids]

    def start(self, table, started):
        for tree in self.trees:
            tree.start(table, started)

    def sample(self, table):
        for tree in self.trees:
            tree.sample(table)

    def ticks(self) -> int | None:
        found = [t for t in (tree.ticks() for tree in self.trees) if t is not None]
        return sum(found) if found else None


class Tracked:
    """Processes listed anew at each sample by `pids()`. Each is known by (pid, starttime), so a
    reused pid is another process."""

    def __init__(self, pids):
        self.pids = pids
        self.started = 0.0
        self.first, self.last = {}, {}
        self.present = set()

    def start(self, table, started):
        self.started, self.first, self.last = started, {}, {}
        self.sample(table)

    def sample(self, table):
        for pid in self.pids():
            stat = table.get(pid)
            if stat is None:
                continue
            key = (stat.pid, stat.starttime)
            if key not in self.first:
                self.first[key] = 0 if stat.starttime >= self.started else own_ticks(stat)
            self.last[key] = own_ticks(stat)
        self.present = {(s.pid, s.starttime) for s in table.values()}

    def ticks(self) -> int:
        return sum(self.last[key] - self.first[key] for key in self.last)

    def gone(self) -> int:
        """Processes seen once and gone at the last sample (what they used since their last sample is lost)."""
        return sum(1 for key in self.last if key not in self.present)

    def processes(self) -> list[tuple[int, int, bool]]:
        """(pid, ticks, gone at the last sample) of each process seen."""
        return [(key[0], self.last[key] - self.first[key], key not in self.present) for key in self.last]

    def ticks_by(self, label_of) -> dict:
        """{label: ticks} of the processes by the label `label_of(pid)` gives each."""
        out = {}
        for key in self.last:
            label = label_of(key[0])
            out[label] = out.get(label, 0) + self.last[key] - self.first[key]
        return out


class Meter:
    """The groups {name: Tree | Trees | Tracked}, read together from one process table at each sample."""

    def __init__(self, groups, *, table=process_table, clock=uptime_ticks):
        self.groups, self.table, self.clock = groups, table, clock
        self.started = None

    def start(self):
        self.started = self.clock()
        table = self.table()
        for group in self.groups.values():
            group.start(table, self.started)

    def sample(self):
        table = self.table()
        for group in self.groups.values():
            group.sample(table)

    def stop(self) -> dict:
        """{name: CPU seconds since start(), or None where the group's processes were not there}."""
        self.sample()
        return {name: seconds(group.ticks()) for name, group in self.groups.items()}


# --- the arithmetic -------------------------------------------------------------------------------

def idle_rates(busy: dict, wall_s: float) -> dict:
    """CPU seconds per wall second of each group, from a reading over an idle window."""
    return {name: None if s is None or wall_s <= 0 else s / wall_s for name, s in busy.items()}


def net_seconds(busy, idle_rate, wall_s):
    """A group's CPU seconds over a run, less what it uses idle over as long (None: not measured)."""
    if busy is None:
        return None
    return busy - (idle_rate or 0.0) * wall_s


def per_call_ms(seconds_used, calls) -> float | None:
    if seconds_used is None or calls <= 0:
        return None
    return round(seconds_used * 1000.0 / calls, 4)


def per_call(busy: dict, idle: dict, wall_s: float, calls: int) -> dict:
    """{group: CPU ms per call, net of the idle rate}, for every group read over the run."""
    return {name: per_call_ms(net_seconds(s, idle.get(name), wall_s), calls) for name, s in busy.items()}


def total(values: dict, names) -> float | None:
    """The sum of the groups `names` that were measured; None if none was."""
    found = [values[name] for name in names if values.get(name) is not None]
    return round(sum(found), 4) if found else None
