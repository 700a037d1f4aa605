"""The dispatcher's backoff: exponential, capped, with jitter, however long failures last."""

from timeouts.dispatch.listener import Backoff


def test_delays_double_up_to_the_cap_and_stay_there_however_many_failures():
    backoff = Backoff(first=0.01, cap=0.1)
    delays = [backoff.next_delay() for _ in range(5000)]  # a dispatcher held back for hours
    assert 0.005 <= delays[0] <= 0.01
    assert all(0.05 <= delay <= 0.1 for delay in delays[10:])
    backoff.reset()
    assert backoff.next_delay() <= 0.01
