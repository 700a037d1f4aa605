"""The scale scenario's pieces that need no database: the loader's plan and due times, the churn's
choice of what to cancel and when, the options, and the scenario's ratios, targets and tables."""

import argparse
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from benchmarks import churn_writer, report, scale
from benchmarks import scale_load as background
from benchmarks.config import BenchConfig
from benchmarks.management.commands.timeouts_bench import _count
from tests.unit.bench.sections import sections

pytestmark = pytest.mark.timeout(60)

NOW = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)


# --- the loader ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("rows", "jobs", "chunk"), [(10, 1, 3), (10, 2, 3), (10, 3, 100), (1, 2, 5), (7, 7, 1),
                                                     (1_000_000, 2, 300_000)])
def test_the_plan_loads_every_row_once_in_order_each_job_a_contiguous_share(rows, jobs, chunk):
    shares = background.plan(rows, jobs, chunk)

    flat = [n for share in shares for first, last in share for n in range(first, last + 1)]
    assert flat == list(range(1, rows + 1))
    assert len(shares) <= jobs
    assert all(last - first + 1 <= chunk for share in shares for first, last in share)
    for share in shares:  # one after another within a job: each statement follows the one before
        assert all(a[1] + 1 == b[0] for a, b in zip(share, share[1:], strict=False))


def test_the_plan_of_no_rows_is_empty_and_bad_sizes_are_refused():
    assert background.plan(0, 2, 10) == []
    for rows, jobs, chunk in ((-1, 1, 1), (1, 0, 1), (1, 1, 0)):
        with pytest.raises(ValueError):
            background.plan(rows, jobs, chunk)


def test_the_background_falls_due_evenly_from_the_lead_to_the_end_of_the_partitions():
    end = datetime(2026, 12, 14, tzinfo=UTC)
    start, until = background.due_window(NOW, 3600, end)
    assert (start, until) == (NOW + timedelta(hours=1), end)

    rows = 1000
    times = [background.due_time(i, rows, start, end) for i in range(1, rows + 1)]
    assert start < times[0] and times[-1] < end  # none on the upper bound: none in DEFAULT
    gaps = {round((b - a).total_seconds(), 3) for a, b in zip(times, times[1:], strict=False)}
    assert gaps == {round((end - start).total_seconds() / rows, 3)}


def test_a_lead_beyond_the_last_partition_is_refused():
    with pytest.raises(ValueError, match="lower the lead"):
        background.due_window(NOW, 30 * 86400, datetime(2026, 12, 14, tzinfo=UTC))


def test_the_end_of_the_partitions_is_the_last_upper_bound_default_left_out():
    parts = [SimpleNamespace(upper=None, is_default=True),
             SimpleNamespace(upper=datetime(2026, 12, 1, tzinfo=UTC), is_default=False),
             SimpleNamespace(upper=datetime(2026, 12, 14, tzinfo=UTC), is_default=False)]
    assert background.partitions_end(parts) == datetime(2026, 12, 14, tzinfo=UTC)
    with pytest.raises(ValueError, match="maintenance"):
        background.partitions_end(parts[:1])


def test_bytes_per_row():
    assert background.per_row_bytes(1, 1024) == 1024.0
    assert background.per_row_bytes(None, 10) is None and background.per_row_bytes(5, 0) is None


# --- the churn -----------------------------------------------------------------------------------

@pytest.mark.parametrize("share", [0.0, 0.5, 0.8, 1.0])
def test_the_churn_cancels_its_share_of_any_run_of_consecutive_tasks(share):
    for first in (0, 1234):
        run = range(first, first + 500)
        count = sum(churn_writer.cancelled(k, share) for k in run)
        assert abs(count - share * len(run)) <= 3, count


def test_a_cancel_comes_between_a_fifth_and_four_fifths_of_the_way_to_the_due_time():
    delays = [churn_writer.cancel_after(k, 20.0) for k in range(1000)]
    assert min(delays) >= 4.0 and max(delays) <= 16.0
    assert max(delays) - min(delays) > 11.0  # spread over the interval, not bunched


# --- options ---------------------------------------------------------------------------------------

def test_row_counts_are_read_in_exponent_and_underscore_form():
    assert _count("1e7") == 10_000_000 and _count("10_000_000") == 10_000_000 and _count("100") == 100
    for text in ("1.5", "many", "1e-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            _count(text)


@pytest.mark.parametrize("options", [{"scale_rows": 0}, {"scale_jobs": 0}, {"churn_cancel": 1.5},
                                     {"churn_cancel": -0.1}, {"churn_rate": 0}, {"churn_ahead": 0},
                                     {"scale_lead": 0}])
def test_bad_scale_options_are_refused(options):
    with pytest.raises(ValueError):
        BenchConfig(scenarios=("scale",), **options)


# --- ratios, targets, tables -----------------------------------------------------------------------

def runs_of(p99, drain, *, reps=3, missing=0):
    """Runs of each variant: the background's variants at p99[v] and drain[v] (default: the empty table's)."""
    out = []
    for rep in range(reps):
        for variant in scale.VARIANTS:
            out.append({"scenario": "scale", "path": variant, "rep": rep, "p99_ms": p99.get(variant, 10.0),
                        "drain_per_s": drain.get(variant, 800.0), "claim_per_s": 3000.0, "missing": missing,
                        "duplicates": 0, "early": 0, "drain_missing": 0, "drain_duplicates": 0, "drain_early": 0,
                        "background_due": 0})
    return out


def checked(runs):
    summary = report.aggregate(runs)
    return {name: ok for _, name, value, check in scale.targets(summary, scale.ratios(runs))
            for ok in [None if value is None else bool(check(value))]}


def test_a_flat_run_meets_every_target():
    results = checked(runs_of({"loaded": 10.5, "loaded_churn": 10.9}, {"loaded": 760}))
    assert len(results) == 5 and all(results.values())


def test_a_slower_drain_or_a_later_p99_with_the_background_misses_its_target():
    results = checked(runs_of({"loaded_churn": 12.0}, {"loaded": 700}))
    misses = sorted(name for name, ok in results.items() if ok is False)
    assert misses == ["scale, under the churn: spread p99 with the background rows / empty table <= 1.1",
                      "scale: drain starts/s with the background rows / empty table >= 0.9"]


def test_the_churn_is_compared_with_the_empty_table_under_the_same_churn():
    # A churn that slows both alike is the churn's cost, not the background's.
    results = checked(runs_of({"empty_churn": 20.0, "loaded_churn": 20.0}, {"empty_churn": 400, "loaded_churn": 400}))
    assert all(results.values())
    ratios = scale.ratios(runs_of({"empty_churn": 20.0}, {}))
    assert ratios["scale"]["empty_churn/empty"]["p99_ms"]["median"] == 2.0


def test_a_lost_task_fails_the_correctness_target():
    results = checked(runs_of({}, {}, missing=1))
    assert [name for name, ok in results.items() if ok is False] == [
        "scale: missing + duplicates + early = 0, spread and drain; no background row due (every run, every variant)"]


def test_the_tables_show_each_variant_and_the_background_once():
    runs = runs_of({}, {}, reps=1)
    loaded = {"rows": 1_000_000, "load_s": 20.0, "load_rows_per_s": 50_000, "vacuum_s": 5.0, "checkpoint_s": 1.0,
              "partitions": 15, "partitions_with_rows": 15, "default_rows": 0, "heap_mb": 200, "indexes_mb": 170,
              "total_mb": 370, "bytes_per_row": 388.0}
    next(r for r in runs if r["path"] == "loaded").update(loaded)
    tables = sections(report.aggregate(runs), scale.ratios(runs))

    main = next((h, rows) for title, h, rows in tables
                if title.startswith("scale: ") and "background rows (" not in title)
    assert [row[0] for row in main[1]] == [scale.LABELS[v] for v in scale.VARIANTS]
    assert all(len(row) == len(main[0]) for row in main[1])
    load = next((h, rows) for title, h, rows in tables if title.startswith("scale: the background rows"))
    assert [row[0] for row in load[1]] == [scale.LABELS["loaded"]]  # the variants without a load are left out
    assert load[1][0][1] == "1,000,000" and load[1][0][-2] == "370"


def test_the_churn_reports_the_mean_and_p99_of_each_kind_of_call_in_ms():
    times = churn_writer.call_times({"schedule": [0.001] * 99 + [0.101], "cancel": []})
    assert times == {"schedule_ms": 2.0, "schedule_p99_ms": 101.0, "cancel_ms": None, "cancel_p99_ms": None}
