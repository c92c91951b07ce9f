"""Approvals in the browser (SCENARIOS S2): the real `runstack` with the scripted demo model, two
people of the demo tenant (the Session owner `demo` and the tenant admin `reviewer`, who may
both decide) in separate browser contexts.

- The demo Session's deletion of draft_to_delete.md waits for a decision: the home page flags it,
  both people see the card; the reviewer rejects and the owner's page follows live, the file stays.
- A fresh Session asked to build the report and delete the draft: while the owner's page is
  offline the reviewer approves; the owner's click then goes over REST, is refused with 409
  `already_decided` and the card says so and shows the reviewer's decision; the file is deleted.
- Interrupting a parked turn cancels its approval: the card turns cancelled, the file stays.
"""

import re
import shutil
from pathlib import Path

import pytest

from ..integration.processes import served_embedded
from .test_workspace import (
    CONTROL_SOCKETS,
    DEMO_TITLE,
    LIVE_TIMEOUT_MS,
    SESSION_URL,
    assistant_messages,
    expect,
    log_in,
)

DEMO_DATA = Path(__file__).resolve().parents[2] / "sessions_app" / "demo_data"
DRAFT = "draft_to_delete.md"
REVIEWER = ("reviewer", "reviewer-pass-1")
PAGE_TIMEOUT_MS = 60_000  # generous: two browsers and a worker share the machine


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A fresh embedded install with the demo seeded and a second decider, served by `runstack`."""
    reviewer = ("create_user", REVIEWER[0], "--tenant", "demo", "--role", "admin", "--password", REVIEWER[1])
    with served_embedded(tmp_path_factory.mktemp("approvals-stack"), ("seed_demo",), reviewer) as served:
        yield served


@pytest.fixture(autouse=True)
def _patient_expect():
    """60 s for every expectation of this module; `expect` is shared, so put the default back."""
    expect.set_options(timeout=PAGE_TIMEOUT_MS)
    yield
    expect.set_options(timeout=5_000)


@pytest.fixture
def open_page(browser, stack):
    """open_page(username, password) -> a logged-in page in its own browser context."""
    contexts, errors = [], []

    def open_one(username="demo", password="demo", init_script=None):
        context = browser.new_context(base_url=stack.base, viewport={"width": 1360, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        page.on("pageerror", lambda exc: errors.append(f"{username}: {exc}"))
        if init_script:
            page.add_init_script(init_script)
        log_in(page, username, password)
        return page

    yield open_one
    for context in contexts:
        context.close()
    assert not errors, (
        f"JavaScript errors in the page: {errors}\n{stack.log.read_text(errors='replace')[-3000:]}"
    )


def session_id(page):
    return page.url.rstrip("/").rsplit("/", 1)[-1]


def workspace(stack, sid):
    matches = list(stack.workspaces.glob(f"*/{sid}"))
    assert len(matches) == 1, matches
    return matches[0]


def pending_card(page):
    card = page.get_by_test_id("approval-card")
    expect(card).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(card).to_have_attribute("data-status", "pending")
    expect(card.get_by_test_id("approval-arguments")).to_contain_text(DRAFT)
    expect(card.get_by_test_id("approval-risk")).to_have_text("destructive")
    expect(card.get_by_test_id("approve-button")).to_be_enabled()
    expect(card.get_by_test_id("reject-button")).to_be_enabled()
    return card


def test_a_rejection_by_one_person_shows_live_on_the_other_page(open_page, stack, tmp_path):
    owner = open_page()
    row = owner.get_by_test_id("session-row").filter(has_text=DEMO_TITLE)
    # The list refreshes itself: the demo reaches the deletion and the row asks for attention.
    expect(row.get_by_test_id("needs-approval")).to_be_visible(timeout=LIVE_TIMEOUT_MS)
    expect(row.locator(".status-badge")).to_have_attribute("data-status", "waiting_approval")
    owner.screenshot(path=str(tmp_path / "home-needs-approval.png"))
    row.get_by_role("link").click()
    expect(owner).to_have_url(SESSION_URL)
    sid = session_id(owner)

    reviewer = open_page(*REVIEWER)
    reviewer.goto(f"/sessions/{sid}/")

    for page in (owner, reviewer):
        expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
        expect(page.get_by_test_id("session-status")).to_have_attribute("data-status", "waiting_approval")
        expect(page.locator("[data-testid=tool-card][data-tool=fs_delete_files]")).to_contain_text(
            "waiting for approval"
        )
    owner_card = pending_card(owner)
    reviewer_card = pending_card(reviewer)
    assert owner_card.get_attribute("data-approval-id") == reviewer_card.get_attribute("data-approval-id")
    owner.screenshot(path=str(tmp_path / "approval-pending.png"))

    reviewer_card.get_by_test_id("approval-comment").fill("Keep the draft, Legal wants it.")
    reviewer_card.get_by_test_id("reject-button").click()
    expect(reviewer_card).to_have_attribute("data-status", "rejected")
    expect(reviewer_card.get_by_test_id("reject-button")).to_be_hidden()

    # The owner's page follows without a reload.
    expect(owner_card).to_have_attribute("data-status", "rejected")
    expect(owner_card.get_by_test_id("approve-button")).to_be_hidden()
    expect(owner_card.get_by_test_id("reject-button")).to_be_hidden()
    expect(owner_card.get_by_test_id("approval-outcome")).to_contain_text(
        re.compile(r"rejected by reviewer", re.IGNORECASE)
    )
    expect(owner_card.get_by_test_id("approval-outcome")).to_contain_text("Keep the draft, Legal wants it.")
    owner_card.screenshot(path=str(tmp_path / "approval-rejected.png"))

    # The model gets the rejection as the call's result and finishes; the file stays.
    gated = owner.locator("[data-testid=tool-card][data-tool=fs_delete_files]")
    expect(gated).to_have_attribute("data-ok", "false", timeout=LIVE_TIMEOUT_MS)
    expect(owner.get_by_test_id("session-status")).to_have_attribute(
        "data-status", "idle", timeout=LIVE_TIMEOUT_MS
    )
    answer = assistant_messages(owner).last.locator(".message-body")
    expect(answer).to_contain_text("report.html", timeout=LIVE_TIMEOUT_MS)
    expect(answer).to_contain_text(f"did not delete {DRAFT}")
    assert (workspace(stack, sid) / DRAFT).is_file()
    # The delivery card shows the rejection as a person's decision, not a failure of the tool.
    delivery = owner.get_by_test_id("delivery-card").last
    expect(delivery).to_have_attribute("data-outcome", "delivered")
    expect(delivery).to_have_attribute("data-checks-ok", "true")
    expect(delivery.get_by_test_id("delivery-failures")).to_have_count(0)
    expect(delivery.get_by_test_id("delivery-decisions")).to_contain_text(
        "fs_delete_files not run — Rejected by reviewer"
    )


def ask_for_report_and_cleanup(page, stack, title):
    """A Session made with the form, given the demo inputs, asked for the report and the deletion."""
    page.get_by_test_id("new-session-title").fill(title)
    page.get_by_test_id("new-session-submit").click()
    expect(page).to_have_url(SESSION_URL)
    sid = session_id(page)
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
    expect(page.get_by_test_id("approval-card")).to_have_count(0)
    # The workspace has no upload in the UI yet: put the inputs in place as seed_demo does.
    for name in ("tickets.csv", DRAFT):
        shutil.copy(DEMO_DATA / name, workspace(stack, sid) / name)
    page.get_by_test_id("composer-input").fill(
        f"tickets.csv holds last week's support tickets: build the weekly KPI report, then delete {DRAFT}."
    )
    page.get_by_test_id("send-button").click()
    return sid


def test_a_decision_taken_elsewhere_while_offline_is_reported_not_overwritten(open_page, stack):
    owner = open_page(init_script=CONTROL_SOCKETS)
    sid = ask_for_report_and_cleanup(owner, stack, "Report with cleanup")
    card = pending_card(owner)
    expect(owner.get_by_test_id("session-status")).to_have_attribute("data-status", "waiting_approval")

    # The owner's connection drops; meanwhile the reviewer approves through the API.
    owner.evaluate("window.__offline = true; window.__sockets.at(-1).socket.close()")
    expect(owner.get_by_test_id("live-indicator")).to_have_attribute("data-state", "reconnecting")
    reviewer = open_page(*REVIEWER)
    csrf = next(c["value"] for c in reviewer.context.cookies() if c["name"] == "csrftoken")
    pending = reviewer.request.get(f"/api/v1/sessions/{sid}/approvals/?status=pending").json()["results"]
    assert [a["id"] for a in pending] == [int(card.get_attribute("data-approval-id"))], pending
    assert pending[0]["tool"] == "fs_delete_files" and pending[0]["arguments"]["paths"] == [DRAFT], pending
    decided = reviewer.request.post(
        f"/api/v1/approvals/{pending[0]['id']}/decide/",
        data={"decision": "approve", "comment": "fine"},
        headers={"X-CSRFToken": csrf},
    )
    assert decided.status == 200, decided.text()

    # The stale card still offers the buttons; the click goes over REST and loses the race.
    expect(card).to_have_attribute("data-status", "pending")
    card.get_by_test_id("reject-button").click()
    expect(card.get_by_test_id("approval-message")).to_contain_text(
        re.compile(r"already decided by someone else", re.IGNORECASE)
    )
    expect(card).to_have_attribute("data-status", "approved")
    expect(card.get_by_test_id("approval-outcome")).to_contain_text(
        re.compile(r"approved by reviewer", re.IGNORECASE)
    )
    expect(card.get_by_test_id("reject-button")).to_be_hidden()

    owner.evaluate("window.__offline = false")
    expect(owner.get_by_test_id("live-indicator")).to_have_attribute(
        "data-state", "live", timeout=LIVE_TIMEOUT_MS
    )
    expect(owner.locator("[data-testid=tool-card][data-tool=fs_delete_files]")).to_have_attribute(
        "data-ok", "true", timeout=LIVE_TIMEOUT_MS
    )
    expect(owner.get_by_test_id("session-status")).to_have_attribute(
        "data-status", "idle", timeout=LIVE_TIMEOUT_MS
    )
    answer = assistant_messages(owner).last.locator(".message-body")
    expect(answer).to_contain_text(f"deleted {DRAFT}", timeout=LIVE_TIMEOUT_MS)
    expect(card).to_have_attribute("data-status", "approved")  # the replayed events agree
    assert not (workspace(stack, sid) / DRAFT).exists()


def test_interrupting_a_parked_turn_cancels_its_approval(open_page, stack):
    owner = open_page()
    sid = ask_for_report_and_cleanup(owner, stack, "Report, cleanup interrupted")
    card = pending_card(owner)
    status = owner.get_by_test_id("session-status")
    expect(status).to_have_attribute("data-status", "waiting_approval")

    owner.get_by_test_id("interrupt-button").click()
    expect(status).to_have_attribute("data-status", "interrupted", timeout=LIVE_TIMEOUT_MS)
    expect(card).to_have_attribute("data-status", "cancelled")
    expect(card.get_by_test_id("approve-button")).to_be_hidden()
    expect(owner.locator("[data-testid=tool-card][data-tool=fs_delete_files]")).to_have_attribute(
        "data-ok", "false"
    )
    assert (workspace(stack, sid) / DRAFT).is_file()
