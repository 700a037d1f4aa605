"""timeouts.stats' human-readable durations and sizes, as `manage.py timeouts_stats` prints them."""

from datetime import timedelta

from timeouts import stats


def test_human_formats():
    assert stats.seconds(0.0123) == "12.3 ms" and stats.seconds(75) == "75.00 s"
    assert stats.seconds(3725) == "62 min 5 s" and stats.seconds(timedelta(days=3)) == "3 d 0 h"
    assert stats.seconds(None) == "-" and stats.human_bytes(2048) == "2.0 kB"
