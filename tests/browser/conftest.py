"""Headless Chromium (Debian's /usr/bin/chromium, driven by Playwright; nothing downloads a
browser) and a logged-in page for a user."""
from pathlib import Path

import pytest
from django.db import connections

from tests.conftest import wait_for

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 900}


@pytest.fixture
def browser(monkeypatch):
    if not CHROMIUM.exists():
        pytest.skip(f"browser tests need Chromium at {CHROMIUM} (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="browser tests need the playwright package")
    # Playwright's sync API marks an asyncio loop as running on this thread while it is open, so
    # Django refuses ORM calls ("async unsafe") and keeps the database connections opened
    # meanwhile apart from the thread's usual ones. Allow the calls, and close those connections
    # before the loop stops: the test database could not be dropped at the end otherwise.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
            connections.close_all()


@pytest.fixture
def log_in(browser, live_portal):
    """log_in(user[, portal_url][, **context options]) -> a page of a fresh browser context,
    logged in through the login form of the portal at portal_url (the session's live portal by
    default); options such as viewport= or timezone_id= go to Playwright's new_context. Whatever
    the Content-Security-Policy refused on any of its pages fails the test at its end (a page
    that needs an inline script or style does not work)."""
    refused = []

    def log_in_as(user, portal_url=live_portal, **options):
        context = browser.new_context(**({"viewport": VIEWPORT} | options), base_url=portal_url)
        context.on("console", lambda message: refused.append(message.text)
                   if message.type == "error" and "Content Security Policy" in message.text else None)
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.goto("/login/")
        page.fill("#id_username", user.username)
        page.fill("#id_password", "pw-" + user.username)        # conftest's make_user password
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{portal_url}/")                       # LOGIN_REDIRECT_URL: the job list
        assert page.locator("header.top nav").get_by_text(f"Log out {user.username}").is_visible()
        return page
    yield log_in_as
    assert refused == [], "the Content-Security-Policy refused what a page needed"


def wait_for_page(page, expression, timeout=15.0):
    """Wait until the JavaScript `expression` is truthy in `page`, asking from here. Playwright's
    own wait_for_function builds its predicate with `new Function` inside the page, which the
    portal's Content-Security-Policy refuses; evaluate is not the page's own code."""
    return wait_for(lambda: page.evaluate(expression), timeout=timeout, message=expression)


def expect(*args, **kwargs):
    from playwright.sync_api import expect as playwright_expect
    return playwright_expect(*args, **kwargs)
