"""Fixtures and facts shared by the end-to-end scenarios (a real engine, the default model; the web app's
browser and page)."""
import os
import shutil

import pytest

from tests.conftest import ENGINE_EXE, model_path

ENGINE = os.environ.get("STRATA_TEST_ENGINE", ENGINE_EXE)


MODEL = model_path()


WEATHER = {"name": "get_weather", "description": "Get the current weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                          "required": ["city"]}}


# ------------------------------------------------------------------------------------------ the browser
CHROMIUM = os.environ.get("STRATA_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
WAIT_MS = 15000       # the longest any step waits for the page (the fake engine answers in well under this)


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium, one per test module (never `playwright install`: given by its path)."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {CHROMIUM} (./strata test installs Debian's chromium as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (requirements-test.txt) drives the "
                                   "browser; ./strata test installs it")
    with sync_api.sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        except Exception as e:  # a browser that cannot start here (sandbox, libraries): skipped with the reason
            pytest.skip(f"Chromium did not start: {str(e).splitlines()[0]}")
        yield b
        b.close()


@pytest.fixture
def page(browser, request):
    """A fresh browser context (empty localStorage) per test; a screenshot when the test failed."""
    ctx = browser.new_context(viewport={"width": 1000, "height": 700})
    pg = ctx.new_page()
    pg.set_default_timeout(WAIT_MS)
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    failed_before = request.session.testsfailed
    yield pg
    if request.session.testsfailed > failed_before:
        shots = request.config.cache.mkdir("strata-web-shots")
        pg.screenshot(path=str(shots / f"{request.node.name}.png"), full_page=True)
        print(f"screenshot: {shots / request.node.name}.png; page errors: {errors}")
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def ask(pg, text):
    """Type a question into the Chat page and send it (Enter)."""
    pg.fill("#text", text)
    pg.press("#text", "Enter")


def answers_done(pg, n):
    """Wait until n answers are finished (a finished answer has its action buttons; a streaming one not)."""
    pg.wait_for_function(f"document.querySelectorAll('.msg.assistant .actions').length >= {n}")
