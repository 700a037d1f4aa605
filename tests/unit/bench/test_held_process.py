"""The line protocol with a child held ready (benchmarks/held_process.py), spoken by both of its
sides: a child process of the test's own, set up as the bench's children are."""

import os
import sys

import pytest

from benchmarks.database import BenchError
from benchmarks.held_process import HeldProcess
from tests.support.processes import ROOT

pytestmark = pytest.mark.timeout(60)

SET_UP = "import django; django.setup(); from benchmarks.held_process import say, wait_for_go, wait_for_stop; "
CHILD = SET_UP + (
    "import json; say('warming up'); wait_for_go(); say(json.dumps({'calls': 3})); wait_for_stop()"
)


def held(code, tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings", "PYTHONPATH": str(ROOT)}
    return HeldProcess([sys.executable, "-c", code], env=env, cwd=ROOT, name="the child", log=tmp_path / "child.log")


def test_a_child_is_held_until_go_gives_its_result_and_stays_until_stopped(tmp_path):
    child = held(CHILD, tmp_path)
    try:
        child.wait_ready(30)  # what it said before `ready` is passed over
        child.check()
        child.go()
        assert child.result(30) == {"calls": 3}
        child.check()  # held after its result, until stop()
    finally:
        child.stop()
    assert child.process.returncode == 0


def test_a_child_that_ends_before_it_is_ready_is_named_with_its_log(tmp_path):
    child = held(SET_UP + "import sys; print('no way', file=sys.stderr); sys.exit(3)", tmp_path)
    try:
        with pytest.raises(BenchError, match=r"^the child exited with 3 \(its log: child\.log\)$"):
            child.wait_ready(30)
    finally:
        child.stop()
    assert "no way" in (tmp_path / "child.log").read_text()


def test_a_child_that_says_nothing_in_time_is_a_timeout(tmp_path):
    child = held(SET_UP + "wait_for_stop()", tmp_path)
    idle = []
    try:
        with pytest.raises(TimeoutError, match="the child said nothing within 2 s"):
            child.line(2, idle=lambda: idle.append(1))
    finally:
        child.stop()
    assert idle  # the caller's checks ran while it waited
