"""When the dispatcher wakes for a deadline (Dispatcher._local), computed without any database."""

import pytest

from timeouts.dispatcher import Dispatcher


def test_the_dispatcher_claims_tasks_due_one_after_another_half_a_lead_at_a_time():
    dispatcher = Dispatcher(lead=0.1)
    dispatcher.db_offset, dispatcher.last_claim = 0.0, 100.0
    # Due well after the last claim: woken a lead (plus the margin) before it, as always.
    assert dispatcher._local(100.2) == pytest.approx(100.101)
    # Due soon after the last claim: not before half a lead after that claim...
    assert dispatcher._local(100.12) == pytest.approx(100.05)
    # ...unless that would leave less than half a lead before it is due.
    assert dispatcher._local(100.08) == pytest.approx(100.031)
