"""The claimers' notes for the health check (store/last_claims.py): the scan and the dispatcher each
note their claims, at most once a second per process, and a note that cannot be written never
keeps claimed tasks from being published."""

import logging
import os
import socket
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from tests.integration.stats.claims_noted import claimed, forget_claims, noted
from timeouts.dispatch.claiming import claim_due
from timeouts.dispatch.dispatcher import Dispatcher
from timeouts.dispatch.scan import scan
from timeouts.models import TimeoutTask
from timeouts.store import last_claims

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]
THIS_PROCESS = f"{socket.gethostname()}:{os.getpid()}"


@pytest.fixture(autouse=True)
def nothing_noted(transactional_db, monkeypatch):
    """No note on the table, and none remembered by this process (its once-a-second throttle)."""
    monkeypatch.setattr(last_claims, "_noted", {})
    forget_claims()
    yield
    forget_claims()


def test_the_scan_notes_that_it_claimed_even_when_nothing_was_due():
    scan()
    [(claimer, (claimed_at, process))] = noted().items()
    assert (claimer, process) == ("scan", THIS_PROCESS)
    assert abs(datetime.now(UTC) - claimed_at) < timedelta(minutes=1)


def test_a_process_notes_a_kind_of_claim_at_most_once_a_second(monkeypatch):
    scan()
    claimed(ago=3600)  # as if the note were an hour old
    scan()  # within the second: not noted again
    [(claimed_at, _)] = noted().values()
    assert datetime.now(UTC) - claimed_at > timedelta(minutes=59)
    monkeypatch.setattr(last_claims, "EVERY", 0.0)
    scan()
    [(claimed_at, _)] = noted().values()
    assert datetime.now(UTC) - claimed_at < timedelta(minutes=1)


def test_the_dispatcher_notes_its_claims(broker):
    task = TimeoutTask.objects.schedule("test.record", "due", at=datetime.now(UTC) - timedelta(seconds=1))
    dispatcher = Dispatcher(keepalive_interval=1)
    thread = threading.Thread(target=dispatcher.run, name="test-dispatcher")
    thread.start()
    try:
        assert dispatcher.stats.wait_for(lambda stats: stats.claimed >= 1, 20), "the dispatcher never claimed"
    finally:
        dispatcher.stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert TimeoutTask.objects.get(job_id=task.job_id).status == Status.DISPATCHED
    assert noted()["dispatcher"][1] == THIS_PROCESS


def test_a_note_that_cannot_be_written_does_not_stop_the_scan(broker, caplog):
    task = TimeoutTask.objects.schedule("test.record", "due", at=datetime.now(UTC) - timedelta(seconds=1))
    with connection.cursor() as cursor:  # a table the note cannot be written to
        cursor.execute("ALTER TABLE timeouts_last_claims RENAME TO timeouts_last_claims_away")
    try:
        with caplog.at_level(logging.WARNING, logger="timeouts.store.last_claims"):
            assert scan() == 1
            assert scan() == 0  # and the scan after it
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE timeouts_last_claims_away RENAME TO timeouts_last_claims")
    assert TimeoutTask.objects.get(job_id=task.job_id).status == Status.DISPATCHED
    assert "could not note the scan's claim on 'default'" in caplog.text


def test_only_the_known_claimers_note():
    with pytest.raises(ValueError, match="claimer must be one of dispatcher, scan, got 'cron'"):
        last_claims.note_claim("cron")
    TimeoutTask.objects.schedule("test.record", "due", at=datetime.now(UTC) - timedelta(seconds=1))
    assert len(claim_due(10)) == 1 and noted() == {}  # a claim alone notes nothing: its claimer does
