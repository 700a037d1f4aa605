"""The businesses page in a real browser (Chromium driven by Playwright, as test_admin_browser.py):
an operator in an incident opens it from the task list, sees a backlog of overdue coupons and the
charts, pauses the coupons, slows the webhooks down below their handler's own rate limit, and sees
both changes on the page, in the database and in the admin log.

The server runs tests/businesses/settings.py: a small shop's handlers (with the limits they declare)
and the demo's order.close. Screenshots go to var/test-logs/; with TIMEOUTS_SCREENSHOT_DOCS=1 the
last one also replaces docs/admin-businesses.png (the operations guide's picture).
"""

import os
import shutil

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection

import timeouts
from tests.support import processes
from tests.system.test_admin_browser import CHROMIUM_ARGS, SCREENSHOTS, chromium  # noqa: F401
from timeouts import registry
from timeouts.models import TimeoutTask

DOCS_SCREENSHOT = processes.ROOT / "docs" / "admin-businesses.png"
SHOP = ("coupon.expire", "webhook.retry", "email.send")
Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(180)]

# What the page shows, made in one statement per kind: g numbers the tasks, t is each one's due time.
# - coupon.expire: 1,200 overdue (a backlog of the last 10 minutes: its handler's queue is stuck)
#   and 2,400 more falling due together 40 minutes from now (a campaign ending);
# - webhook.retry and email.send: done over the last 15 minutes, started 5 to 80 ms late (a few
#   webhooks 2 s late in one minute), and more due over the coming hour;
# - order.close: a few of each.
INSERT = """
INSERT INTO timeouts_task (biz_type, biz_id, status, action_time, run_at, attempts, max_attempts, ttr, created_at,
                           modified_at, started_at, finished_at)
SELECT %(biz_type)s, %(biz_type)s || '-' || g, %(status)s, t, t, (%(status)s = %(done)s)::int, 5, 60,
       t - interval '1 hour', t, CASE WHEN %(status)s = %(done)s THEN t + late END,
       CASE WHEN %(status)s = %(done)s THEN t + late + interval '20 ms' END
FROM (SELECT g, now() + %(first)s::interval + g * %(step)s::interval AS t,
             interval '1 ms' * (5 + (g * 37) %% 75) + CASE WHEN g %% 97 = 0 THEN interval '2 s' ELSE interval '0' END
                 AS late
      FROM generate_series(0, %(n)s - 1) AS g) AS s
"""
# and three webhooks running now, against their concurrency of 5.
RUNNING = """
INSERT INTO timeouts_task (biz_type, biz_id, status, action_time, run_at, attempts, max_attempts, ttr, lease_until,
                           dispatched_at, started_at)
SELECT 'webhook.retry', 'running-' || g, %(running)s, now() - interval '2 s', now() - interval '2 s', 1, 5, 60,
       now() + interval '1 min', now() - interval '2 s', now() - interval '1.9 s'
FROM generate_series(1, 3) AS g
"""
DATA = [  # biz_type, status, n, first due in, seconds between
    ("coupon.expire", Status.PENDING, 1200, "-600 s", 0.5),
    ("coupon.expire", Status.PENDING, 2400, "2400 s", 0.1),
    ("webhook.retry", Status.DONE, 900, "-900 s", 1.0),
    ("webhook.retry", Status.PENDING, 500, "60 s", 7.0),
    ("email.send", Status.DONE, 1500, "-900 s", 0.6),
    ("email.send", Status.PENDING, 1200, "60 s", 3.0),
    ("order.close", Status.DONE, 40, "-900 s", 22.0),
    ("order.close", Status.PENDING, 30, "60 s", 110.0),
]


@pytest.fixture
def shop():
    """The shop's handlers in this process too (timeouts.limits() takes only known biz_types), and
    its tasks in the table."""
    from tests.businesses import timeouts_handlers  # noqa: F401  (registers them)

    with connection.cursor() as cursor:
        for biz_type, status, n, first, step in DATA:
            cursor.execute(INSERT, {"biz_type": biz_type, "status": status, "done": Status.DONE, "n": n,
                                    "first": first, "step": f"{step} s"})
        cursor.execute(RUNNING, {"running": Status.RUNNING})
    yield
    for biz_type in SHOP:
        registry.unregister(biz_type)


@pytest.fixture
def server():
    """runserver with the shop's settings on the test database, stopped by PID."""
    with processes.admin_server(log_name="admin-businesses-runserver",
                                DJANGO_SETTINGS_MODULE="tests.businesses.settings") as base:
        yield base


@pytest.fixture
def operator():
    user = User.objects.create_user("operator", password="operator-pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="timeouts", codename__in=["view_timeouttask", "change_limits"]))
    return user


def test_operator_pauses_a_backlog_and_slows_webhooks_down(chromium, shop, server, operator):  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # Only the browser in this block: Playwright's event loop makes Django refuse ORM calls here.
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 760})
            page.goto(f"{server}/admin/login/?next=/admin/timeouts/timeouttask/")
            page.fill("#id_username", "operator")
            page.fill("#id_password", "operator-pw")
            page.click("input[type=submit], button[type=submit]")
            page.click("a.timeouts-businesses-link")
            expect(page).to_have_url(f"{server}/admin/timeouts/timeouttask/businesses/")

            rows = page.locator("#timeouts-businesses tbody tr")
            expect(rows).to_have_count(4)  # the shop's three and the demo's order.close, in order
            expect(rows.locator("th a")).to_have_text(["coupon.expire", "email.send", "order.close", "webhook.retry"])
            coupons, webhooks = row(page, "coupon.expire"), row(page, "webhook.retry")
            expect(coupons.locator(".timeouts-overdue")).to_have_text("1,200")
            expect(coupons.locator(".timeouts-due")).to_contain_text("2,400 due")
            expect(coupons.locator("svg.timeouts-chart-due rect[fill='#1d4ed8']")).to_have_count(12)
            expect(webhooks.locator("svg.timeouts-chart-lateness title").first).to_contain_text("p99")
            expect(webhooks.locator(".timeouts-rate-limit")).to_have_text("20/s")
            expect(webhooks.locator(".timeouts-running")).to_have_text("3 running")

            coupons.locator("button.timeouts-pause").click()
            expect(page.locator("ul.messagelist")).to_contain_text("Biz type coupon.expire: paused.")
            expect(coupons.locator(".timeouts-state")).to_have_text("paused")
            expect(coupons.locator("button.timeouts-resume")).to_be_visible()

            webhooks.locator("input[name=rate_limit]").fill("5")
            webhooks.locator("button.timeouts-set-limits").click()
            expect(page.locator("ul.messagelist")).to_contain_text(
                "Biz type webhook.retry: set limits: rate_limit 20/s -> 5/s, concurrency 5 -> 5.")
            expect(webhooks.locator(".timeouts-rate-limit")).to_contain_text("5/s")
            expect(webhooks.locator(".timeouts-rate-limit")).to_contain_text("override; handler: 20/s")
            page.click("#toggle-nav-sidebar")  # more room for the charts
            page.screenshot(path=str(SCREENSHOTS / "admin-businesses.png"), full_page=True)
        finally:
            browser.close()

    assert timeouts.limits("coupon.expire").paused
    assert timeouts.limits("webhook.retry") == timeouts.Limits(5.0, 5, False)
    assert list(LogEntry.objects.order_by("pk").values_list("object_repr", "user__username")) == [
        ("biz_type coupon.expire", "operator"), ("biz_type webhook.retry", "operator")]
    if os.environ.get("TIMEOUTS_SCREENSHOT_DOCS") == "1":
        shutil.copyfile(SCREENSHOTS / "admin-businesses.png", DOCS_SCREENSHOT)


def row(page, biz_type):
    return page.locator(f"#timeouts-businesses tr[data-biz-type='{biz_type}']")
