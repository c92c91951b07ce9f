"""The browser workspace end to end: the real `runstack` process (daphne + in-process worker,
scripted demo model) driven by Chromium through Playwright.

Everything the user sees arrives the product's own way: the Session list and history from
the REST API with the browser session, status, plan, tool cards and streamed text over the
Session WebSocket.
"""

import re
import time
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        "browser tests need Debian's Chromium at /usr/bin/chromium (apt-get install chromium; CI installs it)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="browser tests need the playwright package")
expect = sync_api.expect

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LIVE_TIMEOUT_MS = 60_000  # the agent's work: generous, the demo usually takes a few seconds
UI_TIMEOUT_MS = 15_000  # page reactions
SESSION_URL = re.compile(r"/sessions/[0-9a-f-]{36}/$")
DEMO_TITLE = "Support weekly report (demo)"


# Records every status the badge shows and the longest streamed text, as they happen.
WATCH_STATUS_AND_STREAM = """() => {
  const watched = (window.__watched = { statuses: [], streamed: "" });
  const badge = document.querySelector("[data-testid=session-status]");
  new MutationObserver(() => watched.statuses.push(badge.dataset.status)).observe(badge, {
    attributes: true, attributeFilter: ["data-status"],
  });
  const slot = document.getElementById("stream-slot");
  new MutationObserver(() => {
    const stream = slot.querySelector("[data-testid=stream]");
    if (stream && stream.textContent.length > watched.streamed.length) watched.streamed = stream.textContent;
  }).observe(slot, { childList: true, subtree: true, characterData: true });
}"""


def log_in(page, username="demo", password="demo"):
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(re.compile(r"/$"))


def assistant_messages(page):
    return page.locator("[data-testid=message][data-role=assistant]")


def test_the_demo_session_shows_its_run_live(page, tmp_path):
    """S1 + S2 in the browser: the report is built, the deletion of the scratch file waits for
    approval (card with the file and the risk), Approve, then plan done, fs_write tool cards ok,
    the answer, status idle."""
    log_in(page)
    row = page.get_by_test_id("session-row").filter(has_text=DEMO_TITLE)
    expect(row).to_have_count(1)
    expect(row.locator(".status-badge")).to_be_visible()

    row.get_by_role("link").click()

    expect(page).to_have_url(SESSION_URL)
    expect(page.locator("h1")).to_have_text(DEMO_TITLE)
    expect(page.get_by_test_id("model-badge")).to_be_visible()
    expect(page.get_by_test_id("model-badge")).to_have_text("demo model")
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
    status = page.get_by_test_id("session-status")

    # The deletion parks the Session until a person decides.
    card = page.get_by_test_id("approval-card")
    expect(card).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(card).to_have_attribute("data-status", "pending")
    expect(card.get_by_test_id("approval-arguments")).to_contain_text("draft_to_delete.md")
    expect(card.get_by_test_id("approval-risk")).to_have_text("destructive")
    expect(card).to_contain_text("fs_delete_files")
    expect(status).to_have_attribute("data-status", "waiting_approval", timeout=LIVE_TIMEOUT_MS)
    gated = page.locator("[data-testid=tool-card][data-tool=fs_delete_files]")
    expect(gated).to_contain_text("waiting for approval")
    card.screenshot(path=str(tmp_path / "approval-card.png"))

    card.get_by_test_id("approve-button").click()
    expect(card).to_have_attribute("data-status", "approved", timeout=LIVE_TIMEOUT_MS)
    expect(card).to_contain_text(re.compile(r"approved by demo", re.IGNORECASE))
    expect(card.get_by_test_id("approve-button")).to_be_hidden()
    expect(card.get_by_test_id("reject-button")).to_be_hidden()
    expect(gated).to_have_attribute("data-ok", "true", timeout=LIVE_TIMEOUT_MS)

    answer = assistant_messages(page).last
    expect(answer.locator(".message-body")).to_contain_text("report.html", timeout=LIVE_TIMEOUT_MS)
    expect(answer.locator(".message-body")).to_contain_text(re.compile(r"deleted draft_to_delete\.md"))
    expect(answer.get_by_test_id("tool-card")).to_have_count(0)  # the answer, not a tool step
    expect(status).to_have_attribute("data-status", "idle", timeout=LIVE_TIMEOUT_MS)
    expect(status).to_contain_text("idle")
    expect(page.get_by_test_id("interrupt-button")).to_be_disabled()

    tasks = page.get_by_test_id("plan-task")
    expect(tasks).to_have_count(3)
    for index in range(3):
        expect(tasks.nth(index)).to_have_attribute("data-status", "done", timeout=LIVE_TIMEOUT_MS)
    expect(page.get_by_test_id("plan")).to_contain_text("Read tickets.csv")

    writes = page.locator("[data-testid=tool-card][data-tool=fs_write]")
    expect(writes).to_have_count(2)
    for index in range(2):
        expect(writes.nth(index)).to_have_attribute("data-ok", "true")
    expect(writes.first).to_contain_text("report.html")
    expect(page.locator("[data-testid=tool-card][data-tool=plan_create]")).to_have_attribute(
        "data-ok", "true"
    )
    expect(page.locator("[data-testid=message][data-role=user]").first).to_contain_text("tickets.csv")

    # The activity log lists the turn by seq and type, ending as the status said.
    expect(page.locator("#event-log .event[data-type='turn.ended']").last).to_contain_text("completed")
    expect(page.locator("#event-log .event[data-type='session.status']").last).to_contain_text("idle")

    page.screenshot(path=str(tmp_path / "demo-session.png"), full_page=True)


def test_a_new_session_answers_a_message_live(page):
    """Create a Session with the form, send "hello" over the WebSocket, watch it run and settle."""
    log_in(page)
    page.get_by_test_id("new-session-title").fill("Browser hello")
    page.get_by_test_id("new-session-submit").click()

    expect(page).to_have_url(SESSION_URL)
    expect(page.locator("h1")).to_have_text("Browser hello")
    status = page.get_by_test_id("session-status")
    expect(status).to_have_attribute("data-status", "idle")
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
    expect(page.get_by_test_id("plan")).to_contain_text("No plan yet")
    expect(page.get_by_test_id("interrupt-button")).to_be_disabled()
    expect(page.get_by_test_id("guidance-toggle")).not_to_be_checked()

    page.evaluate(WATCH_STATUS_AND_STREAM)
    page.get_by_test_id("composer-input").fill("hello")
    page.get_by_test_id("send-button").click()

    expect(page.get_by_test_id("composer-input")).to_have_value("")
    expect(page.locator("[data-testid=message][data-role=user]")).to_have_text(re.compile(r"hello"))
    expect(assistant_messages(page)).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(assistant_messages(page).first).to_contain_text("demo model")
    expect(status).to_have_attribute("data-status", "idle", timeout=LIVE_TIMEOUT_MS)
    # The streamed text was replaced by the committed message.
    expect(page.get_by_test_id("stream")).to_have_count(0)

    # The badge went through running and back live, as the events said (never guessed from chat).
    seen = page.evaluate("window.__watched")
    assert "running" in seen["statuses"] and seen["statuses"][-1] == "idle", seen
    assert "demo model" in seen["streamed"], seen  # model.delta frames were shown as they came
    statuses = page.locator("#event-log .event[data-type='session.status'] .event-detail")
    expect(statuses).to_have_text(["idle", "running", "idle"])

    # A reload starts from the log: the same conversation, no duplicates.
    page.reload()
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
    expect(page.locator("[data-testid=message]")).to_have_count(2)
    expect(status).to_have_attribute("data-status", "idle")


def test_the_session_list_follows_statuses_live(page):
    """The home list follows `/ws/sessions/`: a Session created and run in another tab appears
    and settles on the list without a reload (its own poll is a minute apart)."""
    log_in(page)
    expect(page.get_by_test_id("session-row").first).to_be_visible()
    other = page.context.new_page()
    other.set_default_timeout(UI_TIMEOUT_MS)
    other.goto("/")
    other.get_by_test_id("new-session-title").fill("Listed live")
    other.get_by_test_id("new-session-submit").click()
    expect(other).to_have_url(SESSION_URL)
    session_id = other.url.rstrip("/").rsplit("/", 1)[-1]

    row = page.locator(f"[data-testid=session-row][data-id='{session_id}']")
    expect(row).to_have_attribute("data-status", "idle")
    expect(row).to_contain_text("Listed live")

    other.get_by_test_id("composer-input").fill("hello")
    other.get_by_test_id("send-button").click()
    expect(assistant_messages(other)).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(row).to_have_attribute("data-status", "idle", timeout=LIVE_TIMEOUT_MS)
    other.close()


# Frames a page sends on its sockets vanish (a network that drops them); events still arrive.
DROP_SENT_FRAMES = """(() => {
  window.WebSocket.prototype.send = function () {};
})();"""


def test_a_message_is_committed_before_the_box_clears_even_with_the_socket_open(page):
    """The composer posts every message through the API (its 202: committed) and clears the box
    only then; a frame on a live socket could vanish with the text already gone."""
    page.add_init_script(DROP_SENT_FRAMES)
    log_in(page)
    page.get_by_test_id("new-session-title").fill("Kept input")
    page.get_by_test_id("new-session-submit").click()
    expect(page).to_have_url(SESSION_URL)
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")

    page.get_by_test_id("composer-input").fill("hello")
    page.get_by_test_id("send-button").click()

    expect(page.get_by_test_id("composer-input")).to_have_value("")
    expect(assistant_messages(page)).to_have_count(1, timeout=LIVE_TIMEOUT_MS)


# Lets a test cut the page's network for WebSockets: every socket stays reachable (to drop it),
# and while `__offline` is set, new ones go to a closed port and fail like a dead network.
CONTROL_SOCKETS = """(() => {
  const Native = window.WebSocket;
  window.__sockets = [];
  window.__offline = false;
  window.WebSocket = class extends Native {
    constructor(url, ...rest) {
      super(window.__offline ? "ws://127.0.0.1:9/" : url, ...rest);
      window.__sockets.push({ url: String(url), offline: window.__offline, socket: this });
    }
  };
})();"""


def test_a_dropped_connection_resumes_from_the_last_seq(page):
    """A whole turn committed while the socket is down arrives after the reconnect, from the log:
    nothing missed, nothing twice, and the page resumes after its last seq instead of from zero."""
    page.add_init_script(CONTROL_SOCKETS)
    log_in(page)
    page.get_by_test_id("new-session-title").fill("Flaky network")
    page.get_by_test_id("new-session-submit").click()
    expect(page).to_have_url(SESSION_URL)
    live = page.get_by_test_id("live-indicator")
    expect(live).to_have_attribute("data-state", "live")
    # The socket opens before the server sends the log's backlog: the page has something to
    # resume after only once the first event is in (under load, "live" came well before it).
    expect(page.locator("#event-log .event").first).to_have_attribute("data-seq", "1")
    api = f"/api/v1/sessions/{page.url.rstrip('/').rsplit('/', 1)[-1]}/"
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")

    page.evaluate("window.__offline = true; window.__sockets.at(-1).socket.close()")
    expect(live).to_have_attribute("data-state", "reconnecting")
    queued = page.request.post(
        f"{api}inputs/", data={"text": "hello while you were away"}, headers={"X-CSRFToken": csrf}
    )
    assert queued.status == 202, queued.text()
    _wait_for_turn_end(page, api)
    assert assistant_messages(page).count() == 0  # nothing reached the page meanwhile
    page.evaluate("window.__offline = false")

    expect(live).to_have_attribute("data-state", "live", timeout=LIVE_TIMEOUT_MS)
    expect(assistant_messages(page)).to_have_count(1)
    expect(assistant_messages(page).first).to_contain_text("demo model")
    expect(page.get_by_test_id("session-status")).to_have_attribute("data-status", "idle")
    expect(page.locator("[data-testid=message][data-role=user]")).to_have_count(1)
    seqs = [
        int(s)
        for s in page.locator("#event-log .event").evaluate_all("(rows) => rows.map((r) => r.dataset.seq)")
    ]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    sockets = page.evaluate("window.__sockets.map((s) => ({url: s.url, offline: s.offline}))")
    resumed = next(s["url"] for s in sockets[1:] if not s["offline"])
    after = int(re.search(r"\?after=(\d+)$", resumed).group(1))
    assert sockets[0]["url"].endswith("?after=0") and 0 < after < seqs[-1], sockets


def _wait_for_turn_end(page, api, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = page.request.get(f"{api}events/?wait=2").json()["events"]
        if any(e["type"] == "turn.ended" for e in events):
            return
    raise AssertionError("the turn did not end")
