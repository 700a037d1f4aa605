"""timeouts.events knows nothing of the metrics: they listen to it, once TimeoutsConfig.ready() has
connected them. A listener that raises is logged, never raised into the code that did the work."""

import subprocess
import sys

from timeouts import events, metrics


def test_the_metrics_listen_to_the_events_once_django_is_ready():
    assert events.listeners.count(metrics.record) == 1
    metrics.connect()  # a second call changes nothing
    assert events.listeners.count(metrics.record) == 1


def test_importing_the_events_imports_no_metrics():
    code = "import sys, timeouts.events; print('timeouts.metrics' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert imported.strip() == "False"


def test_a_listener_that_raises_is_logged_and_the_others_still_hear(monkeypatch, caplog):
    heard = []

    def broken(*event):
        raise RuntimeError("a listener's bug")

    monkeypatch.setattr(events, "listeners", [broken, lambda *event: heard.append(event)])
    events.emit("done", "test.listeners")
    assert heard == [("done", "test.listeners", 1, None)]
    assert "listener" in caplog.text and "a listener's bug" in caplog.text
