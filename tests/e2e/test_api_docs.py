"""/api/docs/ works offline: Swagger UI comes from our own static files (drf-spectacular-sidecar),
so with every request to another host refused the page still renders the API's operations.

The stack is served under a name that is not "localhost"/"127.0.0.1" (Chromium maps it to
loopback), as it would be in production: Swagger UI only skips its online validator badge
(an image from validator.swagger.io) on those two names.
"""

import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from ..integration.processes import embedded_env, free_port, migrate_embedded, running, wait_for_http

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        "browser tests need Debian's Chromium at /usr/bin/chromium (apt-get install chromium; CI installs it)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="browser tests need the playwright package")
expect = sync_api.expect

HOST = "xagent.test"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    f"--host-resolver-rules=MAP {HOST} 127.0.0.1",
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs")
    env = {**embedded_env(root), "ALLOWED_HOSTS": f"127.0.0.1,{HOST}"}
    migrate_embedded(env)
    port = free_port()
    log = root / "runstack.log"
    with running([sys.executable, "manage.py", "runstack", "--port", str(port)], env, log) as proc:
        wait_for_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        yield f"http://{HOST}:{port}", log


def test_the_api_docs_render_with_no_other_host_reachable(stack):
    base, log = stack
    refused = []

    def only_our_own_host(route):
        if urlsplit(route.request.url).hostname == HOST:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.route("**/*", only_our_own_host)

            page.goto(f"{base}/api/docs/")

            operations = page.locator(".opblock-summary-path")
            expect(operations.filter(has_text="/api/v1/sessions/").first).to_be_visible(timeout=15_000)
            expect(operations.filter(has_text="/api/v1/tools/").first).to_be_visible()
            expect(page.locator(".info .title")).to_contain_text("xAgent workspace API")
            page.wait_for_load_state("networkidle")
            assert operations.count() >= 20
        finally:
            browser.close()

    assert not errors, f"JavaScript errors: {errors}\n{log.read_text(errors='replace')[-2000:]}"
    assert not refused, f"the docs page reached for other hosts: {refused}"
