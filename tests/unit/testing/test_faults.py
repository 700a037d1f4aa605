"""timeouts.testing.faults: the TIMEOUTS_FAULTS syntax, the firing rules, the firing log, and that an unarmed
point does nothing."""

import os
import subprocess
import sys

import pytest

from timeouts.testing import faults
from timeouts.testing.faults import FaultInjected, parse


def test_parse_actions_and_rules():
    armed = parse(" claim.after_commit=exit , publish.after_send=raise@0.25,run.before_done=sleep:1.5#3,"
                  "run.after_done=raise#2+")
    assert set(armed) == {"claim.after_commit", "publish.after_send", "run.before_done", "run.after_done"}
    assert (armed["claim.after_commit"].action, armed["claim.after_commit"].nth) == ("exit", None)
    assert (armed["publish.after_send"].action, armed["publish.after_send"].probability) == ("raise", 0.25)
    sleep = armed["run.before_done"]
    assert (sleep.action, sleep.seconds, sleep.nth, sleep.onwards) == ("sleep", 1.5, 3, False)
    assert (armed["run.after_done"].nth, armed["run.after_done"].onwards) == (2, True)
    assert parse("") == {} and parse(None) == {} and parse(" , ") == {}


@pytest.mark.parametrize("text", [
    "claim.after=exit", "claim.after_commit", "claim.after_commit=boom", "claim.after_commit=sleep",
    "claim.after_commit=exit:1", "claim.after_commit=raise@0", "claim.after_commit=raise@1.5",
    "claim.after_commit=raise@x", "claim.after_commit=raise#0", "claim.after_commit=raise#x",
    "claim.after_commit=exit,claim.after_commit=raise",
])
def test_parse_rejects_what_it_does_not_know(text):
    with pytest.raises(ValueError, match="TIMEOUTS_FAULTS"):
        parse(text)


def test_nth_hit_only_and_onwards():
    once, onwards = parse("run.after_start=raise#3,run.after_done=raise#2+").values()
    assert [once.should_fire() for _ in range(5)] == [False, False, True, False, False]
    assert [onwards.should_fire() for _ in range(4)] == [False, True, True, True]


def test_probability_fires_about_that_often():
    [rule] = parse("run.after_start=raise@0.3").values()
    fired = sum(rule.should_fire() for _ in range(4000))
    assert 1000 < fired < 1400


def test_unarmed_points_do_nothing(monkeypatch):
    monkeypatch.setattr(faults, "ARMED", {})
    for point in faults.POINTS:
        assert faults.fault(point) is None
    monkeypatch.setattr(faults, "ARMED", parse("run.after_start=raise"))
    assert faults.fault("run.before_done") is None  # armed elsewhere: still nothing here


def test_raise_and_sleep_fire_and_are_logged(monkeypatch, tmp_path):
    log = tmp_path / "faults.log"
    monkeypatch.setenv("TIMEOUTS_FAULTS_LOG", str(log))
    monkeypatch.setattr(faults, "ARMED", parse("run.after_start=raise#2,run.before_done=sleep:0.01"))
    faults.fault("run.after_start")
    with pytest.raises(FaultInjected, match="run.after_start"):
        faults.fault("run.after_start")
    faults.fault("run.before_done")
    assert issubclass(FaultInjected, RuntimeError)
    pid = os.getpid()
    assert faults.fired(log) == [(pid, "run.after_start", "raise"), (pid, "run.before_done", "sleep:0.01")]
    assert faults.fired(log, "run.before_done") == [(pid, "run.before_done", "sleep:0.01")]
    assert faults.fired(tmp_path / "missing.log") == []


def test_exit_ends_the_process_at_once_after_logging(tmp_path):
    log = tmp_path / "faults.log"
    code = "from timeouts.testing import faults; faults.fault('claim.after_commit'); print('survived')"
    env = {**os.environ, "TIMEOUTS_FAULTS": "claim.after_commit=exit", "TIMEOUTS_FAULTS_LOG": str(log)}
    result = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == faults.EXIT_STATUS and "survived" not in result.stdout
    [(_pid, point, action)] = faults.fired(log)
    assert (point, action) == ("claim.after_commit", "exit")


def test_a_bad_setting_fails_at_import(tmp_path):
    env = {**os.environ, "TIMEOUTS_FAULTS": "nowhere=exit"}
    result = subprocess.run([sys.executable, "-c", "import timeouts.testing.faults"], check=False, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "unknown fault point" in result.stderr
