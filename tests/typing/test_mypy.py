"""`mypy --strict` over host code that calls every public name (host_module.py) reports nothing,
and reports each misuse in misuse.py: the public API is typed for the host's own type check.

The check runs in a subprocess with the project's mypy.ini (django-stubs' plugin, timeouts read
as an installed package), its cache in a temporary folder of its own."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MARKED = re.compile(r"# error: (.+)$")

# Quick even with a fresh cache, so both legs run it (the plugin sets up the Django under test).
pytestmark = pytest.mark.timeout(300)
# mypy's report: one line per finding, "path:line: severity: message".
FINDING = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): (?P<severity>\w+): (?P<message>.*)$")


def expected_errors() -> dict[int, str]:
    lines = (HERE / "misuse.py").read_text().splitlines()
    return {number: match.group(1) for number, line in enumerate(lines, start=1) if (match := MARKED.search(line))}


def test_mypy_strict_reports_nothing_on_host_code_and_each_misuse(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(HERE / "mypy.ini"), "--cache-dir", str(tmp_path),
         "--no-error-summary", "--show-error-codes", str(HERE / "host_module.py"), str(HERE / "misuse.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.stderr == "", result.stderr
    reported = {}
    for line in result.stdout.splitlines():
        finding = FINDING.match(line)
        assert finding, f"a line mypy's report should not have: {line!r}\n{result.stdout}"
        if finding["severity"] != "note":
            where = (Path(finding["path"]).name, int(finding["line"]))
            reported.setdefault(where, []).append(finding["message"])
    elsewhere = {where: messages for where, messages in reported.items() if where[0] != "misuse.py"}
    assert not elsewhere, result.stdout
    missed = {number: text for number, text in expected_errors().items()
              if not any(text in message for message in reported.get(("misuse.py", number), []))}
    assert not missed, result.stdout
    unexpected = {number for name, number in reported if name == "misuse.py"} - set(expected_errors())
    assert not unexpected, result.stdout
