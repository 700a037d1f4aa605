"""The shards_* scenarios' pieces that need no database: where the bench puts a key, the claim rate
over several shards, the CPU meter, the demo settings' TIMEOUTS_SHARD_URLS, and the wiring of the
scenarios into the ratios, the targets and the tables."""

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings

from benchmarks import report, shards
from benchmarks.shard_load import claim_rate, keys_on, shard_of
from benchmarks.shard_servers import CpuMeter
from tests.support.processes import ROOT
from tests.unit.bench.sections import sections
from timeouts.storage import shards as timeouts_shards

pytestmark = pytest.mark.timeout(30)

ALIASES = ["default", "shard_b", "shard_c"]


def test_the_bench_puts_each_key_on_the_shard_the_host_processes_route_it_to():
    with override_settings(TIMEOUTS={"SHARDS": ALIASES}):
        for key in range(300):
            assert ALIASES[shard_of(key, 3)] == timeouts_shards.place("benchmarks.noop", str(key)).alias
    assert all(shard_of(key, 3) == 2 for key in keys_on(2, 3, 5, "probe-"))


def test_the_claim_rate_over_shards_runs_from_the_first_claim_to_the_end_of_the_last():
    t0 = datetime(2025, 1, 1, tzinfo=UTC)

    def at(seconds):
        return t0 + timedelta(seconds=seconds)

    # One shard, four batches of 500 a second apart: the last one ends a second after its claim.
    assert claim_rate([[(at(s), 500) for s in range(4)]]) == 500
    # Two shards side by side, the second starting half a second later: 4,000 tasks over 4.5 s.
    both = [[(at(s), 500) for s in range(4)], [(at(s + 0.5), 500) for s in range(4)]]
    assert claim_rate(both) == round(4000 / 4.5)
    assert claim_rate([[(at(0), 500)]]) is None  # one claim: no interval to time it by


BUSY = "import time\nwhile time.process_time() < 0.4: pass\ninput()"  # 0.4 s of CPU, then waits


def test_the_cpu_meter_counts_a_process_born_after_it_started_from_its_birth():
    children = []
    meter = CpuMeter({"busy": lambda: [c.pid for c in children if c.poll() is None]})
    meter.start()
    children.append(subprocess.Popen([sys.executable, "-c", BUSY], stdin=subprocess.PIPE))
    try:
        for _ in range(200):
            if meter.stop()["busy"] >= 0.35:  # 0.4 s, give or take a clock tick
                break
            time.sleep(0.05)
        assert 0.35 <= meter.stop()["busy"] < 1.0
    finally:
        children[0].stdin.close()
        children[0].kill()
        children[0].wait()


def demo_settings(**env) -> dict:
    code = ("import json, project.settings as s; "
            "print(json.dumps({'databases': {a: [d['NAME'], d['HOST'], d['PORT']] for a, d in s.DATABASES.items()}, "
            "'shards': s.TIMEOUTS.get('SHARDS')}))")
    environ = {k: v for k, v in os.environ.items() if k != "TIMEOUTS_SHARD_URLS"}
    done = subprocess.run([sys.executable, "-c", code], env={**environ, "PYTHONPATH": str(ROOT), **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=20, check=True)
    return json.loads(done.stdout)


def test_the_demo_settings_take_more_shards_from_the_environment():
    assert demo_settings()["shards"] is None  # the default: one shard
    urls = "shard1=postgres://postgres@127.0.0.1:5433/one,shard2=postgres://postgres@127.0.0.1:5434/two"
    got = demo_settings(TIMEOUTS_SHARD_URLS=urls)
    assert got["shards"] == ["default", "shard1", "shard2"]
    assert got["databases"]["shard1"] == ["one", "127.0.0.1", 5433]
    assert got["databases"]["shard2"] == ["two", "127.0.0.1", 5434]


def runs_of_one_repeat(rep, *, overhead=0.97, outage=1.2):
    runs = [{"scenario": "shards_drain", "path": variant, "rep": rep, "claim_per_s": 5000, "start_per_s": 2000,
             "publish_per_cpu_s": 3000, "drain_per_cpu_s": 1000, "missing": 0, "duplicates": 0, "early": 0}
            for variant in shards.DRAIN_VARIANTS]
    runs += [{"scenario": "shards_overhead", "path": "sharded", "rep": rep, "claim_per_s": 5000 * overhead,
              "start_per_s": 2000, "missing": 0, "duplicates": 0, "early": 0},
             {"scenario": "shards_overhead", "path": "before_shards", "rep": rep, "claim_per_s": 5000,
              "start_per_s": 2000, "missing": 0, "duplicates": 0, "early": 0},
             {"scenario": "shards_outage", "path": "all_up", "rep": rep, "p50_ms": 2, "p99_ms": 10, "all_p99_ms": 10,
              "n": 1300, "missing": 0, "duplicates": 0, "early": 0},
             {"scenario": "shards_outage", "path": "one_stopped", "rep": rep, "p50_ms": 2, "p99_ms": 10 * outage,
              "n": 1300, "missing": 0, "duplicates": 0, "early": 0}]
    runs += [{"scenario": "shards_idle", "path": f"shards_{k}", "rep": rep, "idle_qps": 0.1 * k, "per_shard_qps": 0.1,
              "idle_cpu_pct": 0.2 + 0.05 * k, "per_shard_cpu_pct": (0.2 + 0.05 * k) / k} for k in (1, 2, 4)]
    runs += [{"scenario": "shards_rate", "path": variant, "rep": rep, "start_span_s": span, "start_per_s": 2000 / span,
              "max_per_1s": most, "n": 2000, "missing": 0, "duplicates": 0, "early": 0}
             for variant, span, most in (("even", 9.9, 205), ("skewed", 14.0, 190 + 20 * rep))]
    return runs


def test_the_shard_scenarios_have_their_ratios_targets_and_tables():
    runs = runs_of_one_repeat(0) + runs_of_one_repeat(1, overhead=0.9, outage=1.4)
    summary = report.aggregate(runs)
    ratios = shards.ratios(runs)
    assert ratios["shards_overhead"]["sharded/before_shards"]["claim_per_s"]["median"] == pytest.approx(0.935)
    assert ratios["shards_drain"]["clusters_4/server_1"]["start_per_s"]["median"] == 1.0
    targets = {name: value for _, name, value, _ in shards.targets(summary, ratios)}
    checks = {name: check(value) for _, name, value, check in shards.targets(summary, ratios)}
    overhead = "shards_overhead: claim+publish/s, one shard / before shards >= 0.95"
    assert targets[overhead] == pytest.approx(0.935) and checks[overhead] is False
    assert checks["shards_outage: live shards' p99, one cluster stopped / all up <= 1.5"] is True
    assert checks["shards_idle: CPU per shard, 4 shards / 1 shard <= 1.5"] is True
    assert checks["shards_drain: missing + duplicates + early = 0 (every run, every variant)"] is True
    assert checks["shards_rate: spread over the shards, the starts take >= 9.5 s (median)"] is True
    assert checks["shards_rate: all on one shard, >= 120 starts/s (the parts follow the tasks; median)"] is True
    # The most in one second is the worst of every run: 210 in the second repeat.
    window = ("shards_rate: no 1 s window with more than 220 starts on all the shards together "
              "(every run, both variants)")
    assert targets[window] == 210 and checks[window] is True
    titles = [title for title, _, _ in sections(summary, ratios)]
    assert sum(title.startswith("shards_") for title in titles) == 5
