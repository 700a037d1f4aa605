"""When the dispatcher wakes for a deadline (Dispatcher._local) and how far ahead it claims,
computed without any database."""

import pytest

from timeouts.dispatch.dispatcher import Dispatcher


def test_the_dispatcher_claims_tasks_due_one_after_another_half_a_lead_at_a_time():
    dispatcher = Dispatcher(lead=0.1)
    dispatcher.db_offset, dispatcher.last_claim = 0.0, 100.0
    # Due well after the last claim: woken a lead (plus the margin) before it, as always.
    assert dispatcher._local(100.2) == pytest.approx(100.101)
    # Due soon after the last claim: not before half a lead after that claim...
    assert dispatcher._local(100.12) == pytest.approx(100.05)
    # ...unless that would leave less than half a lead before it is due.
    assert dispatcher._local(100.08) == pytest.approx(100.031)


def test_a_dispatcher_held_back_claims_what_falls_due_before_its_next_claim():
    """Backing off up to the backoff's cap between claims, it claims that much further ahead, so a
    task of another biz_type is still claimed a whole lead before it is due."""
    dispatcher = Dispatcher(lead=0.1)
    assert dispatcher._claim_lead() == pytest.approx(0.1)
    dispatcher.empty_claims = 2  # still due after two claims in a row: backing off
    assert dispatcher._claim_lead() == pytest.approx(0.1 + dispatcher.contention_backoff.cap)
