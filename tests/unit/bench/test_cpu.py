"""CPU accounting for durable_cpu: /proc stat lines, the groups of processes over a run, the
arithmetic per call, and the scenario's wiring into the ratios, the targets and the tables."""

import os

import pytest

from benchmarks import cpu, durable, report
from benchmarks.config import BenchConfig
from benchmarks.durable_cpu import broker_port, figures, session_role
from tests.unit.bench.sections import sections

pytestmark = pytest.mark.timeout(30)


def line(pid, comm="postgres", ppid=1, utime=0, stime=0, cutime=0, cstime=0, starttime=0):
    """A /proc/<pid>/stat line with the fields that matter here."""
    return (f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194304 101 0 0 0 {utime} {stime} {cutime} {cstime} "
            f"20 0 1 0 {starttime} 3133440 412 18446744073709551615 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0")


def table(*stats):
    return {s.pid: s for s in (cpu.parse_stat(text) for text in stats)}


def test_a_stat_line_gives_the_pid_parent_times_and_birth():
    stat = cpu.parse_stat(line(42, ppid=7, utime=120, stime=30, cutime=5, cstime=2, starttime=9000))

    assert stat == cpu.ProcStat(pid=42, comm="postgres", ppid=7, utime=120, stime=30, cutime=5, cstime=2,
                                starttime=9000)


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields():
    stat = cpu.parse_stat(line(43, comm="postgres: app (idle) x)", ppid=8, utime=11, stime=3, starttime=77))

    assert (stat.comm, stat.ppid, stat.utime, stat.stime, stat.starttime) == ("postgres: app (idle) x)", 8, 11, 3, 77)


def test_this_process_reads_itself_in_proc():
    mine = cpu.read_stat(os.getpid())

    assert mine.pid == os.getpid() and mine.ppid == os.getppid()
    assert os.getpid() in cpu.process_table()
    assert cpu.read_stat(2**22 + 1) is None  # beyond any pid: gone


def test_a_tree_counts_its_own_time_its_living_descendants_and_those_it_reaped():
    procs = table(line(10, utime=5, stime=5, cutime=100, cstime=20), line(11, ppid=10, utime=30, stime=10),
                  line(12, ppid=11, utime=7), line(13, ppid=99, utime=1000))

    assert cpu.tree_ticks(procs, 10) == 10 + 120 + 40 + 7
    assert cpu.tree_ticks(procs, 11) == 47
    assert cpu.tree_ticks(procs, 14) is None


def test_a_child_that_ends_during_the_run_is_counted_once_through_its_parent():
    """At the start the child is alive with 40 ticks; it uses 10 more and ends; its parent reaps it
    (its 50 ticks move to the parent's cutime) and forks another, which uses 5."""
    at_start = table(line(10, utime=1), line(11, ppid=10, utime=40))
    at_end = table(line(10, utime=2, cutime=50), line(12, ppid=10, utime=5, starttime=10))
    parent, children = cpu.Tree(10, "self"), cpu.Tree(10, "children")
    for group in (parent, children):
        group.start(at_start, started=5)
        group.sample(at_end)

    assert parent.ticks() == 1
    assert children.ticks() == 10 + 5


def test_a_tree_whose_process_is_gone_is_not_measured():
    tree = cpu.Tree(10)
    tree.start(table(line(10, utime=1)), started=0)
    tree.sample(table(line(11, utime=1)))

    assert tree.ticks() is None
    with pytest.raises(ValueError):
        cpu.Tree(10, "grandchildren")


def test_trees_add_up_the_processes_found():
    trees = cpu.Trees([10, 20])
    trees.start(table(line(10, utime=1), line(20, utime=5)), started=0)
    trees.sample(table(line(10, utime=4), line(20, utime=9)))

    assert trees.ticks() == 3 + 4
    assert cpu.Trees([]).ticks() is None


def test_a_tracked_process_counts_from_the_start_or_from_its_birth():
    listed = [[10], [10, 11], [10, 11, 12]]
    tracked = cpu.Tracked(lambda: listed.pop(0))
    tracked.start(table(line(10, utime=100, starttime=1)), started=50)
    # 11 was born before the start but listed only later: counted from when it was seen
    tracked.sample(table(line(10, utime=110, starttime=1), line(11, utime=30, starttime=2),
                         line(12, utime=3, starttime=60)))
    tracked.sample(table(line(10, utime=120, starttime=1), line(11, utime=35, starttime=2),
                         line(12, utime=8, starttime=60)))

    assert tracked.ticks() == 20 + 5 + 8
    assert tracked.gone() == 0


def test_a_reused_pid_is_another_process_and_one_gone_is_counted_as_gone():
    listed = [[10], [10]]
    tracked = cpu.Tracked(lambda: listed.pop(0))
    tracked.start(table(line(10, utime=100, starttime=1)), started=50)
    tracked.sample(table(line(10, utime=4, starttime=70)))  # 10 ended; its pid went to a new session

    assert tracked.ticks() == 0 + 4  # the first one's use after the start was never seen
    assert tracked.gone() == 1
    assert sorted(tracked.processes()) == [(10, 0, True), (10, 4, False)]


def test_tracked_processes_add_up_by_label():
    listed = [[10, 11, 12], [10, 11, 12]]
    tracked = cpu.Tracked(lambda: listed.pop(0))
    tracked.start(table(line(10, utime=1), line(11, utime=1), line(12, utime=1)), started=50)
    tracked.sample(table(line(10, utime=5), line(11, utime=11), line(12, utime=2)))

    assert tracked.ticks_by(lambda pid: "pool" if pid in (10, 11) else "caller") == {"pool": 14, "caller": 1}


def test_a_session_serves_the_process_holding_its_client_socket():
    roles = {"caller": 100, "worker_main": 200, "dispatcher": None}

    assert session_role(100, 1, roles) == "caller"
    assert session_role(200, 1, roles) == "worker_main"
    assert session_role(201, 200, roles) == "worker_pool"
    assert session_role(300, 1, roles) == "other"
    assert session_role(None, None, roles) == "other"


def test_the_meter_reads_every_group_from_one_table_and_gives_seconds():
    tables = [table(line(10, utime=100), line(11, ppid=10, utime=50)),
              table(line(10, utime=150), line(11, ppid=10, utime=250))]
    meter = cpu.Meter({"main": cpu.Tree(10, "self"), "pool": cpu.Tree(10, "children"), "gone": cpu.Tree(99)},
                      table=lambda: tables.pop(0), clock=lambda: 0.0)
    meter.start()

    assert meter.stop() == {"main": 50 / cpu.TICKS_PER_SECOND, "pool": 200 / cpu.TICKS_PER_SECOND, "gone": None}


def test_per_call_figures_are_net_of_the_idle_rate():
    idle = cpu.idle_rates({"worker": 0.05, "broker": 0.5, "gone": None}, wall_s=5.0)
    assert idle == {"worker": 0.01, "broker": 0.1, "gone": None}

    per = cpu.per_call({"worker": 3.2, "broker": 1.0, "caller": 0.6, "gone": None}, idle, wall_s=20.0, calls=1000)

    assert per == {"worker": pytest.approx(3.0), "broker": pytest.approx(-1.0), "caller": pytest.approx(0.6),
                   "gone": None}
    assert cpu.total(per, ("worker", "caller", "gone")) == pytest.approx(3.6)
    assert cpu.total(per, ("gone",)) is None
    assert cpu.per_call_ms(1.0, 0) is None


def test_the_scenario_totals_the_groups_that_serve_the_calls_alone_and_shows_the_shared_beside_them():
    busy = {"caller": 1.0, "worker_main": 2.0, "worker_pool": 3.0, "dispatcher": 0.5, "postgres": 1.5,
            "postgres_server": 2.5, "broker": 0.8}
    idle = {"worker_main": 0.01, "postgres_server": 0.02}

    out = figures(busy, idle, wall_s=10.0, n=1000)

    assert out["worker_main_ms"] == pytest.approx(1.9)
    assert out["postgres_other_ms"] == pytest.approx(2.3 - 1.5)
    assert "postgres_server_ms" not in out
    assert out["total_ms"] == pytest.approx(1.0 + 1.9 + 3.0 + 0.5 + 1.5)
    assert out["total_with_broker_ms"] == pytest.approx(out["total_ms"] + 0.8)


def test_the_plain_messages_have_no_dispatcher_in_their_total():
    out = figures({"caller": 1.0, "worker_main": 1.0, "worker_pool": 1.0}, {}, wall_s=1.0, n=1000)

    assert out["total_ms"] == pytest.approx(3.0) and out["total_with_broker_ms"] == pytest.approx(3.0)
    assert out["postgres_other_ms"] is None


def test_the_broker_is_found_by_its_port_on_this_machine_only():
    assert broker_port("redis://127.0.0.1:6379/5") == 6379
    assert broker_port("redis://localhost/5") == 6379
    assert broker_port("amqp://guest:guest@127.0.0.1//") == 5672
    assert broker_port("redis://redis.internal:6379/0") is None


def runs_of_one_repeat(rep, durable_total, plain_total):
    common = {"scenario": "durable_cpu", "rep": rep, "missing": 0, "duplicates": 0}
    return [{**common, "path": "durable", "total_ms": durable_total, "total_with_broker_ms": durable_total + 0.3,
             "caller_ms": 0.4, "worker_main_ms": 1.0, "worker_pool_ms": 1.8, "dispatcher_ms": 0.5,
             "postgres_ms": 1.4, "broker_ms": 0.3, "postgres_for_caller_ms": 0.6, "postgres_for_worker_main_ms": 0.1,
             "postgres_for_worker_pool_ms": 0.5, "postgres_for_dispatcher_ms": 0.2, "postgres_for_other_ms": 0.0},
            {**common, "path": "celery_plain", "total_ms": plain_total, "total_with_broker_ms": plain_total + 0.3,
             "caller_ms": 0.3, "worker_main_ms": 0.8, "worker_pool_ms": 1.0, "postgres_ms": 0.3,
             "broker_ms": 0.3}]


def test_the_scenario_has_its_ratio_target_and_table():
    runs = runs_of_one_repeat(0, 5.0, 2.5) + runs_of_one_repeat(1, 3.0, 2.5) + runs_of_one_repeat(2, 3.5, 2.5)
    summary = report.aggregate(runs)
    ratios = durable.ratios(runs)

    assert ratios["durable_cpu"]["durable/celery_plain"]["total_ms"]["median"] == pytest.approx(1.4)
    targets = {name: (value, check(value)) for scenario, name, value, check in durable.targets(summary, ratios)
               if scenario == "durable_cpu"}
    assert len(targets) == 2
    ratio_target = next(name for name in targets if "<= 1.25" in name)
    assert targets[ratio_target] == (pytest.approx(1.4), False)
    assert targets["durable_cpu: missing + duplicates = 0 (every run, both variants)"] == (0, True)
    tables = {title: rows for title, _, rows in sections(summary, ratios)}
    ours = [rows for title, rows in tables.items() if title.startswith("durable_cpu")]
    assert len(ours) == 2  # the groups, and PostgreSQL's split by the process each session serves
    assert [row[0] for row in ours[0]] == ["DurableTask", "plain Celery message"]
    assert ours[1][0][1:] == ["0.60", "0.10", "0.50", "0.20", "0"]


def test_the_options_refuse_a_negative_rate_or_idle_reading():
    with pytest.raises(ValueError, match="cpu_rate"):
        BenchConfig(cpu_rate=-1)
    with pytest.raises(ValueError, match="n_durable_cpu"):
        BenchConfig(n_durable_cpu=0)
    assert BenchConfig(cpu_rate=0, cpu_idle_seconds=0).cpu_rate == 0
