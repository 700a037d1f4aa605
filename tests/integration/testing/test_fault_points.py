"""The fault points inside the claim fire on either side of its commit (timeouts.testing.faults on a real
PostgreSQL)."""

import pytest

from timeouts.dispatch.claiming import claim_due
from timeouts.models import TimeoutTask
from timeouts.testing import faults
from timeouts.testing.faults import FaultInjected, parse


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("point", "status_after"), [("claim.before_commit", TimeoutTask.Status.PENDING),
                                                     ("claim.after_commit", TimeoutTask.Status.DISPATCHED)])
def test_claim_points_fire_before_and_after_the_claim_commits(monkeypatch, point, status_after):
    task = TimeoutTask.objects.schedule("test.record", "fault", delay=0)
    monkeypatch.setattr(faults, "ARMED", parse(f"{point}=raise"))
    with pytest.raises(FaultInjected):
        claim_due(10)
    task.refresh_from_db()
    assert task.status == status_after  # rolled back: PENDING; committed: DISPATCHED
    task.cancel()
    assert claim_due(10) == []  # an empty claim fires nothing
