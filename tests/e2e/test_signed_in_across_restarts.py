"""A restart of `make run` keeps people signed in, and a page whose login ended says so (Chromium
against a real `runstack`).

`make run` runs `seed_demo` at every start: it must change nothing that exists (resetting the demo
password would end every browser session). A page whose login ended elsewhere stops reconnecting
and offers "sign in again" instead of showing "offline" forever."""

import re
import sys

import pytest

from ..integration.processes import embedded_env, free_port, manage, migrate_embedded, running, wait_for_http
from .conftest import watched_page
from .test_workspace import LIVE_TIMEOUT_MS, SESSION_URL, assistant_messages, expect, log_in

# Every socket the page opens, reachable from the test (to drop one on purpose).
CONTROL_SOCKETS = """(() => {
  const Native = window.WebSocket;
  window.__sockets = [];
  window.WebSocket = class extends Native {
    constructor(url, ...rest) { super(url, ...rest); window.__sockets.push(this); }
  };
})();"""


@pytest.fixture
def install(tmp_path):
    env = embedded_env(tmp_path)
    migrate_embedded(env)
    assert manage(env, "seed_demo").returncode == 0
    return env, tmp_path, free_port()


def serve(env, root, port, name):
    return running([sys.executable, "manage.py", "runstack", "--port", str(port)], env, root / f"{name}.log")


def open_new_session(page, title):
    log_in(page)
    page.get_by_test_id("new-session-title").fill(title)
    page.get_by_test_id("new-session-submit").click()
    expect(page).to_have_url(SESSION_URL)
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")


def test_a_restart_of_make_run_keeps_the_page_signed_in(browser, install):
    env, root, port = install
    base = f"http://127.0.0.1:{port}"
    with watched_page(browser, base, root / "second.log") as page:
        with serve(env, root, port, "first") as proc:
            wait_for_http(f"{base}/healthz", proc, root / "first.log")
            open_new_session(page, "Across a restart")
        # The stack is down: the page notices, and keeps trying.
        expect(page.get_by_test_id("live-indicator")).not_to_have_attribute("data-state", "live")
        assert manage(env, "seed_demo").returncode == 0  # as `make run` does at every start
        with serve(env, root, port, "second") as proc:
            wait_for_http(f"{base}/healthz", proc, root / "second.log")
            expect(page.get_by_test_id("live-indicator")).to_have_attribute(
                "data-state", "live", timeout=LIVE_TIMEOUT_MS
            )
            expect(page.get_by_test_id("sign-in-again")).to_have_count(0)
            page.get_by_test_id("composer-input").fill("hello after the restart")
            page.get_by_test_id("send-button").click()
            expect(assistant_messages(page)).to_have_count(1, timeout=LIVE_TIMEOUT_MS)


def test_a_page_whose_login_ended_offers_sign_in_not_offline(browser, install):
    env, root, port = install
    base = f"http://127.0.0.1:{port}"
    with serve(env, root, port, "stack") as proc:
        wait_for_http(f"{base}/healthz", proc, root / "stack.log")
        with watched_page(browser, base, root / "stack.log") as page:
            page.add_init_script(CONTROL_SOCKETS)
            open_new_session(page, "Signed out elsewhere")
            session_path = re.sub(r"^https?://[^/]+", "", page.url)

            other = page.context.new_page()  # the same browser, another tab: log out there
            other.goto("/")
            other.get_by_role("button", name="Log out").click()
            expect(other).to_have_url(re.compile(r"/accounts/login/$"))  # the logout is done
            other.close()
            page.evaluate("() => window.__sockets.at(-1).close()")  # the next connect is refused

            link = page.get_by_test_id("sign-in-again")
            expect(link).to_be_visible(timeout=LIVE_TIMEOUT_MS)
            expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "signed-out")
            expect(page.locator("#composer-note")).to_contain_text("Signed out — sign in again")
            link.click()
            expect(page).to_have_url(re.compile(r"/accounts/login/\?next="))
            page.get_by_label("Username").fill("demo")
            page.get_by_label("Password").fill("demo")
            page.get_by_role("button", name="Log in").click()
            expect(page).to_have_url(re.compile(re.escape(session_path) + "$"))
