"""Ratios between two sets of runs, taken per repeat (the runs of one repeat ran side by side, on
the same machine state) and summarised as median [min-max]."""

from .stats import summarize


def paired(runs, scenario, a, b, metric):
    """summary of a/b per repeat, for runs of `scenario` on paths a and b."""
    return across(runs, (scenario, a, metric), (scenario, b, metric))


def across(runs, a, b):
    """summary of a/b per repeat, a and b each (scenario, path, metric): the same metric of two
    paths, or two scenarios' metrics measured in the same repeat."""
    by = {}
    for r in runs:
        for side, (scenario, path, metric) in (("a", a), ("b", b)):
            if r.get("scenario") == scenario and r.get("path") == path:
                by.setdefault(r["rep"], {})[side] = r.get(metric)
    return summarize([x["a"] / x["b"] for x in by.values() if x.get("a") is not None and x.get("b")])


def by_rep(ours, theirs, metric, their_metric):
    """summary of ours/theirs per repeat, for our runs against a peer harness's runs of the same repeat."""
    by = {}
    for r in ours:
        by.setdefault(r["rep"], [None, None])[0] = r.get(metric)
    for p in theirs:
        if p.get("bench_rep") in by:
            by[p["bench_rep"]][1] = p.get(their_metric)
    return summarize([a / b for a, b in by.values() if a is not None and b])


def ratios_of(runs, pairs) -> dict:
    """{scenario: {"a/b": {metric: summary}}} of paired() for each (scenario, a, b, metric) of
    `pairs` that has runs: the ratios the targets read."""
    out = {}
    for scenario, a, b, metric in pairs:
        s = paired(runs, scenario, a, b, metric)
        if s:
            out.setdefault(scenario, {}).setdefault(f"{a}/{b}", {})[metric] = s
    return out


def median_ratio(table, scenario, pair, metric):
    """The median of one ratios_of() entry, rounded as the targets show it; None if not measured."""
    s = table.get(scenario, {}).get(pair, {}).get(metric)
    return None if s is None else round(s["median"], 3)
