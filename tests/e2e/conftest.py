"""Shared by the browser tests: one Chromium per test module (each module serves its own stack)."""

from contextlib import contextmanager

import pytest


@pytest.fixture(scope="module")
def browser():
    # Imported here: test_workspace skips its module when Chromium or Playwright is missing, and
    # a conftest must not fail collection for that.
    from .test_workspace import CHROMIUM, CHROMIUM_ARGS, sync_api

    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A fresh embedded install, seeded with the demo, served by `runstack` on a free port (one per
    module; a module that needs more setup defines its own `stack`)."""
    from ..integration.processes import served_embedded

    with served_embedded(tmp_path_factory.mktemp("stack"), ("seed_demo",)) as served:
        yield served


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    # The call's report on the test, so a fixture's teardown can tell a failed test (`page`).
    report = yield
    if report.when == "call":
        item.call_report = report
    return report


@pytest.fixture
def page(browser, stack, request):
    """A watched page on the module's stack. A test that fails prints the tail of the stack's log
    (shown with the failure): what the server did is most of what there is to see of a flake."""
    with watched_page(browser, stack.base, stack.log) as page:
        yield page
    report = getattr(request.node, "call_report", None)
    if report is not None and report.failed:
        print(
            f"--- the stack's log, last 6000 characters ---\n{stack.log.read_text(errors='replace')[-6000:]}"
        )


@contextmanager
def watched_page(browser, base_url=None, log=None):
    """A fresh browser context and page that fails the test on any JavaScript error (with the
    tail of the server `log`, when given)."""
    from .test_workspace import UI_TIMEOUT_MS

    context = browser.new_context(
        **({"base_url": base_url} if base_url else {}), viewport={"width": 1360, "height": 900}
    )
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
    finally:
        context.close()
    tail = f"\n{log.read_text(errors='replace')[-3000:]}" if log is not None else ""
    assert not errors, f"JavaScript errors in the page: {errors}{tail}"
