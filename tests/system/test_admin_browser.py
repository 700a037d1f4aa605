"""The admin in a real browser: Debian's Chromium (/usr/bin/chromium, headless) driven by Playwright
against `manage.py runserver` on the test database. An operator logs in, filters the overdue
tasks, cancels one, and sees the message and the task's new status.

bin/test installs what this needs (playwright from requirements/test.txt; Chromium with apt-get when
/usr/bin/chromium is missing; Playwright's own browsers are never downloaded). Without Chromium the
test is skipped, except in CI (CI=true), where it fails.

Screenshots go to var/test-logs/; with TIMEOUTS_SCREENSHOT_DOCS=1 the last one also replaces
docs/admin.png (the README's picture).
"""

import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User

from tests.support import processes
from tests.support.factories import make_task
from timeouts.models import TimeoutTask

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"]
SCREENSHOTS = processes.ROOT / "var" / "test-logs"
DOCS_SCREENSHOT = processes.ROOT / "docs" / "admin.png"
Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def chromium():
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing: apt-get install chromium (bin/test does this when it runs as root)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


@pytest.fixture
def server():
    """runserver on the test database, in its own process group, stopped by PID."""
    with processes.admin_server(log_name="admin-browser-runserver") as base:
        yield base


def make(biz_id, status, at, biz_type="test.record", attribute=None, late=0.2):
    """A task in `status`; one that started did so `late` seconds after its action_time."""
    state = {}
    if status in (Status.RUNNING, Status.DONE, Status.DEAD):
        state["started_after"] = late
    if status == Status.DEAD:
        state["last_error"] = "Traceback (most recent call last):\nRuntimeError: 503"
    return make_task(status, biz_type=biz_type, biz_id=biz_id, at=at, attribute=attribute or {"order": biz_id}, **state)


@pytest.fixture
def operator():
    user = User.objects.create_user("operator", password="operator-pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="timeouts", codename__in=["view_timeouttask", "cancel_timeouttask"]))
    return user


def test_operator_filters_overdue_tasks_and_cancels_one(chromium, server, operator):
    from playwright.sync_api import expect, sync_playwright

    now = datetime.now(UTC)
    overdue = [make(f"order-{1040 + i}", Status.PENDING, now - timedelta(minutes=2 + i)) for i in range(3)]
    for i, (status, minutes, late) in enumerate([(Status.DONE, 20, 0.004), (Status.DONE, 35, 0.012),
                                                (Status.RUNNING, 1, 0.3), (Status.DEAD, 50, 0.008),
                                                (Status.CANCELLED, 90, 0)]):
        make(f"order-{1000 + i}", status, now - timedelta(minutes=minutes), late=late)
    make("hook-77", Status.PENDING, now + timedelta(hours=3), biz_type="test.fail", attribute={"url": "https://x"})
    make("order-1050", Status.PENDING, now + timedelta(minutes=25))
    target, second = overdue[0], overdue[1]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    # Only the browser in this block: Playwright's event loop makes Django refuse ORM calls here.
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 800})
            page.goto(f"{server}/admin/login/?next=/admin/timeouts/timeouttask/")
            page.fill("#id_username", "operator")
            page.fill("#id_password", "operator-pw")
            page.click("input[type=submit], button[type=submit]")
            expect(page.locator("#result_list")).to_be_visible()

            page.click("#changelist-filter a:has-text('overdue (pending, due)')")
            expect(page).to_have_url(f"{server}/admin/timeouts/timeouttask/?due=overdue")
            rows = page.locator("#result_list tbody tr")
            expect(rows).to_have_count(3)
            page.check(f"input[name=_selected_action][value='{target.job_id}']")
            page.select_option("select[name=action]", "cancel_selected")
            page.click("div.actions button[type=submit]")
            expect(page.locator("ul.messagelist")).to_contain_text("Cancelled 1 task.")
            expect(rows).to_have_count(2)  # no longer overdue
            page.screenshot(path=str(SCREENSHOTS / "admin-browser-1-cancelled.png"))

            page.goto(f"{server}/admin/timeouts/timeouttask/")  # no filter: every task again
            page.fill("#searchbar", str(target.job_id))
            page.press("#searchbar", "Enter")
            expect(rows).to_have_count(1)
            expect(rows.first.locator(".timeouts-status")).to_have_text("cancelled")
            page.click(f"#result_list a:has-text('{target.job_id}')")
            expect(page.locator(".field-status_display .readonly")).to_have_text("cancelled")

            # The README's picture: the whole list, a second cancel, its message and the statuses.
            page.goto(f"{server}/admin/timeouts/timeouttask/")
            page.click("#toggle-nav-sidebar")  # more room for the columns
            page.check(f"input[name=_selected_action][value='{second.job_id}']")
            page.select_option("select[name=action]", "cancel_selected")
            page.click("div.actions button[type=submit]")
            expect(page.locator("ul.messagelist")).to_contain_text("Cancelled 1 task.")
            page.screenshot(path=str(SCREENSHOTS / "admin-browser-2-list.png"))
        finally:
            browser.close()

    assert TimeoutTask.objects.get(job_id=target.job_id).status == Status.CANCELLED
    assert TimeoutTask.objects.get(job_id=second.job_id).status == Status.CANCELLED
    assert TimeoutTask.objects.get(job_id=overdue[2].job_id).status == Status.PENDING
    if os.environ.get("TIMEOUTS_SCREENSHOT_DOCS") == "1":
        DOCS_SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(SCREENSHOTS / "admin-browser-2-list.png", DOCS_SCREENSHOT)
