"""The businesses page's charts: well-formed inline SVG, one bar per bucket with its numbers in a
<title>, the part a query did not read hatched, and what the chart shows said in its aria-label."""

import xml.etree.ElementTree as ET

from timeouts.admin import charts

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg):
    return ET.fromstring(str(svg))


def bars(root, colour):
    return [rect for rect in root.iter(f"{SVG}rect") if rect.get("fill") == colour]


def test_due_chart_draws_a_bar_per_bucket_scaled_to_the_largest():
    root = parse(charts.due_chart([("19:00-19:05", 10), ("19:05-19:10", 0), ("19:10-19:15", 5)]))
    drawn = bars(root, charts.DUE_COLOUR)
    assert [rect.find(f"{SVG}title").text for rect in drawn] == [
        "19:00-19:05: 10 due", "19:05-19:10: 0 due", "19:10-19:15: 5 due"]
    heights = [float(rect.get("height")) for rect in drawn]
    assert heights[0] == charts.HEIGHT - 2 and heights[1] == 0 and heights[2] == heights[0] / 2
    assert root.get("aria-label") == "15 tasks due in the next hour, at most 10 in one bucket"
    assert root.find(f".//{SVG}pattern") is None  # read to the end: nothing hatched


def test_due_chart_hatches_what_was_not_read_and_says_at_least():
    root = parse(charts.due_chart([("a", 7), ("b", 3), ("c", 0)], read_buckets=1, chart_id="x"))
    unread = [rect for rect in root.iter(f"{SVG}rect") if rect.get("class") == "timeouts-chart-unread"]
    assert len(unread) == 1 and unread[0].get("fill") == "url(#timeouts-unread-x)"
    assert float(unread[0].get("x")) == charts.WIDTH / 3
    assert root.find(f".//{SVG}pattern").get("id") == "timeouts-unread-x"
    titles = [rect.find(f"{SVG}title").text for rect in bars(root, charts.DUE_COLOUR)]
    assert titles == ["a: 7 due", "b: at least 3 due", "c: at least 0 due"]
    assert root.get("aria-label").startswith("at least 10 tasks")


def test_lateness_chart_draws_p99_behind_p50_and_skips_empty_minutes():
    root = parse(charts.lateness_chart([("19:00", 0.01, 0.2, 40), ("19:01", None, None, 0), ("19:02", 2.0, 4.0, 3)]))
    p99, p50 = bars(root, charts.P99_COLOUR), bars(root, charts.P50_COLOUR)
    assert len(p99) == len(p50) == 2
    assert float(p99[1].get("height")) == charts.HEIGHT - 2  # the worst p99 is the top
    assert p50[1].find(f"{SVG}title").text == "19:02: p50 2.00 s, p99 4.00 s, 3 tasks"
    assert root.get("aria-label") == "lateness, the worst minute's p99: 4.00 s"
    empty = parse(charts.lateness_chart([("19:00", None, None, 0)]))
    assert empty.get("aria-label") == "no task fell due" and not bars(empty, charts.P50_COLOUR)


def test_text_in_the_svg_is_escaped():
    root = parse(charts.due_chart([("<b>&", 1)], chart_id='"><script>'))
    assert root.find(f".//{SVG}title").text == "<b>&: 1 due"
    assert "<script>" not in str(charts.due_chart([("a", 1)], read_buckets=0, chart_id='"><script>'))
