"""Shared by the browser tests: one Chromium per test module (each module serves its own stack)."""

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
