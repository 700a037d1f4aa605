"""The main path's targets, as the bench checks them: against Celery for the lateness and the last
start, against the raw statement for scheduling."""

from benchmarks.targets import targets

SCENARIOS = ("spread", "burst", "schedule")


def checks(ratio_table):
    return {row["target"]: row["ok"] for row in targets({}, ratio_table, 5.0, SCENARIOS) if row["ok"] is not None}


def ratio(value):
    return {"median": value, "min": value, "max": value}


def test_the_spreads_p99_is_held_to_half_celerys_eta():
    table = {"spread": {"dispatcher/celery": {"p99_ms": ratio(0.5)}}}
    assert checks(table) == {"spread: dispatcher lateness p99 / Celery ETA's <= 0.5": True}

    table["spread"]["dispatcher/celery"]["p99_ms"] = ratio(0.51)
    assert checks(table) == {"spread: dispatcher lateness p99 / Celery ETA's <= 0.5": False}


def test_the_bursts_last_start_is_held_to_four_fifths_of_celerys():
    table = {"burst": {"dispatcher/celery": {"max_ms": ratio(0.81)}}}
    assert checks(table) == {"burst: dispatcher last start / Celery ETA last start <= 0.8": False}


def test_scheduling_without_notify_is_held_to_the_raw_statements_pace():
    table = {"schedule": {"single/raw_insert": {"sched_per_s": ratio(0.84)},
                          "single_notify/raw_insert": {"sched_per_s": ratio(0.7)},
                          "bulk/raw_copy": {"sched_per_s": ratio(0.8)},
                          "bulk_notify/raw_copy": {"sched_per_s": ratio(0.49)}}}
    assert checks(table) == {"schedule() >= 0.85x raw INSERT": False,
                             "schedule() with NOTIFY >= 0.7x raw INSERT": True,
                             "bulk_schedule() >= 0.8x raw COPY": True,
                             "bulk_schedule() with NOTIFY >= 0.5x raw COPY": False}
