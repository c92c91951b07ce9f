"""The timeline card for `session.recovered`, in Chromium: an embedded stack is killed mid-turn
and restarted (tests/integration/test_embedded_recovery.py), then the Session page shows what
recovery restored, and what ran next."""

import re

import pytest

from ..integration.test_embedded_recovery import PASSWORD, killed_and_restarted
from .test_workspace import UI_TIMEOUT_MS, expect


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


def test_the_timeline_says_what_recovery_restored_and_what_runs_next(page, tmp_path, model_server):
    with killed_and_restarted(tmp_path, model_server) as (base, _key, session_id):
        page.goto(f"{base}/accounts/login/")
        page.get_by_label("Username").fill("alice")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        expect(page).to_have_url(re.compile(r"/$"))
        page.goto(f"{base}/sessions/{session_id}/")

        card = page.get_by_test_id("session-recovered")
        expect(card).to_have_count(1)
        expect(card).to_contain_text("another took over")
        expect(card).to_contain_text("Restored: turn 1 after 0 steps.")
        expect(card).to_contain_text("1 model answer was cut off")
        expect(card).to_contain_text("Next: the turn continues with step 1.")
        # A call cut off by the lost runner is explained by the card, not shown as a failed turn.
        expect(page.get_by_test_id("turn-error")).to_have_count(0)
        card.screenshot(path=str(tmp_path / "recovered-card.png"))
