"""Smoke test of `manage.py timeouts_bench`: tiny runs end to end, as a user runs it (a child
process), on a database and a Redis database of its own. Each test checks the shape of the JSON of
its scenarios and that no task went missing, ran twice or ran early; the numbers themselves are for
the docs (explanation/benchmarks).

The tests selected in this module share ONE bench run (the module-scoped `bench`), of the scenarios
they read, each at its own size: the command starts, creates and migrates its database once, and
every scenario empties the tables and the broker before it runs, as in any run of several scenarios."""

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.core.management import get_commands

from tests.support.processes import ROOT

# The bench is a development tool: its runs (one_leg) are checked under one Django. Not the Django
# tasks backend's, whose code differs between Django's versions. The first test runs the shared bench
# run in its set-up: the timeout covers it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]

LATENESS = ("p50_ms", "p90_ms", "p99_ms", "max_ms", "missing", "duplicates", "early", "start_per_s")
RUN_TIMEOUT = 600  # seconds for the whole run (each scenario's own waits are bounded by the options below)

# Options of every scenario: a tiny run (short windows and leads, a fast scan, short idle, settle and
# restart times). `--drain-timeout` and `--wait-tail` only bound the waits for starts that do come.
COMMON = ["--repeat", "1", "--window", "1", "--lead", "2", "--scan-interval", "1", "--wait-tail", "5",
          "--drain-timeout", "120", "--idle-settle", "1", "--idle-seconds", "2", "--memory-settle", "1",
          "--restart-from", "3", "--restart-to", "6", "--restart-kill-at", "4", "--restart-down", "1"]
# Each test's scenarios and their sizes.
SCENARIOS = {
    "test_tiny_run_writes_json_with_every_field_and_loses_nothing": (
        ("spread", "drain", "publish", "schedule", "idle"),
        {"n_spread": 50, "n_drain": 50, "n_single": 50, "n_bulk": 50, "n_idle": 50}),
    "test_durable_task_against_celery_eta_tiny_run": (
        ("durable_spread", "durable_memory", "durable_restart", "durable_cost"),
        {"n_durable_spread": 60, "n_durable_memory": 60, "n_durable_restart": 60, "n_durable_cost": 60}),
    "test_django_tasks_backend_tiny_run": (
        ("tasks_spread", "tasks_drain", "tasks_enqueue"),
        {"n_tasks_spread": 60, "n_tasks_drain": 60, "n_tasks_enqueue": 60}),
    "test_business_isolation_tiny_run": (
        ("isolation_neighbour", "isolation_cost"),
        {"n_backlog": 300, "n_isolation_spread": 300, "n_claim": 300}),
    "test_rate_limit_tiny_run": (("isolation_rate",), {"n_rate": 300}),
    "test_durable_task_cpu_per_call_tiny_run": (
        ("durable_cpu",), {"n_durable_cpu": 40, "cpu_rate": 100, "cpu_idle_seconds": 1}),
    "test_debounce_against_replace_tiny_run": (
        ("debounce",), {"n_debounce": 100, "debounce_calls": 3, "debounce_writers": 2, "debounce_block": 50,
                        "debounce_delay": 2, "debounce_max_wait": 3}),
    # An 8 s outage: skippable tasks due in its first seconds are over 5 s late when the worker is back.
    # The stream outlasts the recovery without the policy also where the new worker takes seconds to
    # start and the backlog runs slowly (a loaded 2-core machine, the other pytest process beside it).
    "test_late_recovery_tiny_run": (("late_recovery",), {"n_late": 200, "outage": 8, "late_stream": 30}),
    "test_tracing_on_against_off_tiny_run": (("tracing",), {}),
}


def bench_command(test_names, database, json_path):
    """The command line of one run of the scenarios of these tests."""
    scenarios, sizes = [], {}
    for name in test_names:
        names, own_sizes = SCENARIOS[name]
        scenarios += names
        sizes.update(own_sizes)
    paths = ["scan", "celery"] + (["dispatcher"] if "timeouts_dispatcher" in get_commands() else [])
    size_options = [option for name, n in sizes.items() for option in (f"--{name.replace('_', '-')}", str(n))]
    return [sys.executable, "-m", "django", "timeouts_bench", "--database", database,
            "--broker-url", settings.CELERY_BROKER_URL, "--json", str(json_path), "--scenarios", ",".join(scenarios),
            "--paths", ",".join(paths), *COMMON, *size_options]


@pytest.fixture(scope="module")
def bench(request, tmp_path_factory):
    """(JSON result, stdout) of one bench run of the scenarios of this module's selected tests."""
    from benchmarks import tasks_backend

    selected = [item.originalname for item in request.session.items
                if item.module is request.module and item.originalname in SCENARIOS]
    if not tasks_backend.available():  # its test skips: the bench would refuse its scenarios
        selected = [name for name in selected if name != "test_django_tasks_backend_tiny_run"]
    db = settings.DATABASES["default"]
    test_db = db.get("TEST", {}).get("NAME") or f"test_{db['NAME']}"
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{test_db}"
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL", "PYTHONPATH")}
    # project.settings, whose own broker (CELERY_BROKER_URL, unset here) the bench must not use.
    env.update(DJANGO_SETTINGS_MODULE="project.settings", DATABASE_URL=url, PYTHONPATH=str(ROOT))
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    command = bench_command(selected, f"{test_db}_run", out)
    done = subprocess.run(command, check=False, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def runs_of(result) -> dict:
    return {(r["scenario"], r["path"]): r for r in result["runs"]}


def failures(result, scenarios) -> list:
    """The run's notes of a failure, but those of the other tests' scenarios (each test sees its own)."""
    others = {name for names, _sizes in SCENARIOS.values() for name in names} - set(scenarios)
    return [note for note in result["notes"] if "failed" in note and note.split("/")[0] not in others]


def target_scenarios(result, scenarios) -> set:
    return {t["scenario"] for t in result["targets"] if t["scenario"] in scenarios}


@pytest.mark.one_leg
def test_tiny_run_writes_json_with_every_field_and_loses_nothing(bench):
    result, stdout = bench
    scenarios = ("spread", "drain", "publish", "schedule", "idle")
    dispatcher = "timeouts_dispatcher" in get_commands()
    paths = ["scan", "celery"] + (["dispatcher"] if dispatcher else [])

    assert not failures(result, scenarios), result["notes"]
    for key in ("nproc", "ram_gb", "loadavg_start", "postgresql", "redis", "python", "celery", "psycopg"):
        assert result["machine"][key] is not None, key
    runs = runs_of(result)
    for scenario in ("spread", "drain"):
        for path in paths:
            run = runs[(scenario, path)]
            assert "error" not in run, run
            assert run["n"] == 50 and run["started"] == 50, run
            assert run["missing"] == run["duplicates"] == run["early"] == 0, run
            assert all(run[key] is not None for key in LATENESS), run
            assert result["summary"][scenario][path]["p99_ms"]["median"] == run["p99_ms"]
    assert runs[("drain", "scan")]["claim_per_s"] is None  # 50 tasks are one claim: no rate
    for path in paths:
        assert runs[("publish", path)]["claimed"] == 50, runs[("publish", path)]
    for variant in ("raw_insert", "single", "single_keyed", "single_notify", "raw_insert_notify", "raw_copy", "bulk",
                    "bulk_notify"):
        assert runs[("schedule", variant)]["sched_per_s"] > 0
    assert runs[("schedule", "single_notify")]["notifications"] >= 1
    assert runs[("schedule", "raw_insert_notify")]["notifications"] >= 1
    assert runs[("schedule", "single")]["notifications"] == 0
    for path in ["scan"] + (["dispatcher"] if dispatcher else []):
        assert runs[("idle", path)]["idle_qps"] is not None
        assert runs[("idle", path)]["idle_cpu_pct"] is not None
    assert target_scenarios(result, scenarios) == set(scenarios)
    assert "Lateness" in stdout and "Targets" in stdout
    # Each run says how much CPU time the hypervisor took meanwhile: these VMs are noisy.
    assert "steal %" in stdout and all(0 <= r["cpu_steal_pct"] <= 100 for r in result["runs"])
    if dispatcher:
        assert result["ratios"]["spread"]["scan/dispatcher"]["p50_ms"]["median"] > 0


@pytest.mark.one_leg
def test_durable_task_against_celery_eta_tiny_run(bench):
    result, stdout = bench
    scenarios = ("durable_spread", "durable_memory", "durable_restart", "durable_cost")

    assert not failures(result, scenarios), result["notes"]
    runs = runs_of(result)
    for variant in ("durable", "celery_eta"):
        spread = runs[("durable_spread", variant)]
        assert spread["n"] == spread["started"] == 60, spread
        assert spread["missing"] == spread["duplicates"] == spread["early"] == 0, spread
        assert spread["p99_ms"] is not None and spread["sched_per_s"] > 0
        assert runs[("durable_cost", variant)]["sched_per_s"] > 0
    for variant in ("idle", "durable", "celery_eta"):
        assert runs[("durable_memory", variant)]["rss_mb"] > 0
    assert runs[("durable_memory", "durable")]["stored"] == 60
    # Killed -9 with calls still to come: DurableTask runs every one of them, never early; only a
    # call running when the worker was killed (at most one per pool process) may run twice...
    restart = runs[("durable_restart", "durable")]
    assert restart["n"] == restart["started"] == 60, restart
    assert restart["missing"] == restart["early"] == restart["waiting"] == 0, restart
    assert restart["duplicates"] <= 2 and restart["duplicates_other"] == 0, restart
    # ...while the ETA messages the dead worker held wait for Redis's visibility timeout.
    eta = runs[("durable_restart", "celery_eta")]
    assert eta["missing"] > 0 and eta["waiting"] > 0, eta
    assert set(result["ratios"]["durable_spread"]["durable/celery_eta"]) == {"p50_ms", "p99_ms", "max_ms"}
    assert result["ratios"]["durable_memory"]["durable/idle"]["rss_mb"]["median"] > 0
    assert target_scenarios(result, scenarios) == {"durable_spread", "durable_memory", "durable_restart"}
    assert "durable_restart" in stdout and "DurableTask" in stdout


def test_django_tasks_backend_tiny_run(request):
    from benchmarks import tasks_backend

    if not tasks_backend.available():
        pytest.skip("timeouts.backends.TimeoutsBackend or Django's tasks framework is not importable")
    result, stdout = request.getfixturevalue("bench")
    scenarios = ("tasks_spread", "tasks_drain", "tasks_enqueue")

    assert not failures(result, scenarios), result["notes"]
    runs = runs_of(result)
    for scenario in ("tasks_spread", "tasks_drain"):
        run = runs[(scenario, "timeouts")]
        assert run["n"] == run["started"] == 60, run
        assert run["missing"] == run["duplicates"] == 0, run
        assert run["start_per_s"] > 0 and run["sched_per_s"] > 0
    assert runs[("tasks_spread", "timeouts")]["early"] == 0
    assert runs[("tasks_spread", "timeouts")]["p99_ms"] is not None
    assert runs[("tasks_enqueue", "timeouts")]["sched_per_s"] > 0
    # Without --peers django_tasks there is nothing to divide by: the ratio targets are not measured.
    ratio_targets = [t for t in result["targets"] if "django-tasks-db's" in t["target"]]
    assert len(ratio_targets) == 3 and all(t["ok"] is None for t in ratio_targets)
    assert "TimeoutsBackend" in stdout


@pytest.mark.one_leg
def test_business_isolation_tiny_run(bench):
    result, stdout = bench

    assert not failures(result, ("isolation_neighbour", "isolation_cost")), result["notes"]
    runs = runs_of(result)
    for variant in ("spread_alone", "together"):
        run = runs[("isolation_neighbour", variant)]
        assert run["n"] == run["started"] == 300, run
        assert run["missing"] == run["duplicates"] == run["early"] == 0, run
    for variant in ("backlog_alone", "together"):
        run = runs[("isolation_neighbour", variant)]
        assert run["backlog_per_s"] > 0 and run["backlog_missing"] == run["backlog_duplicates"] == 0, run
    for variant in ("current", "previous"):
        assert runs[("isolation_cost", variant)]["claim_per_s"] > 0
    assert result["ratios"]["isolation_cost"]["current/previous"]["claim_per_s"]["median"] > 0
    assert "isolation_neighbour" in stdout


@pytest.mark.one_leg
def test_rate_limit_tiny_run(bench):
    result, _ = bench

    assert not failures(result, ("isolation_rate",)), result["notes"]
    rate = runs_of(result)[("isolation_rate", "limited")]
    assert rate["n"] == rate["started"] == 300 and rate["missing"] == rate["duplicates"] == rate["early"] == 0, rate
    assert 1 <= rate["max_per_1s"] <= 300 and rate["start_span_s"] > 0


@pytest.mark.one_leg
def test_durable_task_cpu_per_call_tiny_run(bench):
    result, stdout = bench

    assert not failures(result, ("durable_cpu",)), result["notes"]
    runs = runs_of(result)
    for variant in ("durable", "celery_plain"):
        run = runs[("durable_cpu", variant)]
        assert "error" not in run, run
        assert (run["missing"], run["duplicates"]) == (0, 0), run
        assert run["total_ms"] is not None and run["worker_pool_ms"] is not None, run
    assert runs[("durable_cpu", "durable")]["dispatcher_ms"] is not None
    assert "total_ms" in result["ratios"]["durable_cpu"]["durable/celery_plain"]
    assert target_scenarios(result, ("durable_cpu",)) == {"durable_cpu"}
    assert "plain Celery message" in stdout


@pytest.mark.one_leg
def test_debounce_against_replace_tiny_run(bench):
    result, _ = bench

    assert not failures(result, ("debounce",)), result["notes"]
    runs = runs_of(result)
    for variant in ("replace", "debounce"):
        run = runs[("debounce", variant)]
        assert run["missing"] == run["duplicates"] == run["early"] == run["cancelled_started"] == 0, run
        assert run["keys_run_once"] == 100 and run["calls_per_s"] > 0, run
    assert runs[("debounce", "debounce")]["over_cap"] == 0
    assert target_scenarios(result, ("debounce",)) == {"debounce"}


@pytest.mark.one_leg
def test_late_recovery_tiny_run(bench):
    result, stdout = bench

    assert not failures(result, ("late_recovery",)), result["notes"]
    runs = runs_of(result)
    for variant in ("policy", "no_policy"):
        run = runs[("late_recovery", variant)]
        assert run["n"] == 800, run  # 200 due in the outage, 30 s of the stream at 20/s
        assert run["missing"] == run["duplicates"] == run["early"] == 0, run
        assert run["skip_errors"] == run["run_over_policy"] == 0, run
        assert run["recovery_s"] is not None and run["back_s"] > 0, run
    assert runs[("late_recovery", "policy")]["skipped"] > 0
    assert runs[("late_recovery", "no_policy")]["skipped"] == 0
    assert target_scenarios(result, ("late_recovery",)) == {"late_recovery"}
    assert "late_recovery" in stdout


@pytest.mark.one_leg
def test_tracing_on_against_off_tiny_run(bench):
    pytest.importorskip("opentelemetry.sdk")
    result, _ = bench

    assert not failures(result, ("tracing",)), result["notes"]
    runs = runs_of(result)
    for variant in ("off", "on"):
        run = runs[("tracing", variant)]
        assert run["n"] == run["started"] > 0, run
        assert run["missing"] == run["duplicates"] == run["early"] == 0, run
        assert run["drain_missing"] == run["drain_duplicates"] == run["drain_early"] == 0, run
        assert run["p99_ms"] is not None and run["drain_per_s"] > 0, run
    assert runs[("tracing", "off")]["traced"] == 0
    on = runs[("tracing", "on")]
    # Every task stored its context; each spread task's schedule span, each task's run span and the
    # dispatch spans of their batches (one per biz_type of a published batch) were exported.
    assert on["traced"] == 2 * on["n"] and on["spans"] >= on["n"] + on["traced"] + 1, on
    assert {"p99_ms", "drain_per_s"} <= set(result["ratios"]["tracing"]["on/off"])
