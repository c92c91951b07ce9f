"""The workspace home keeps a newcomer's Sessions in order: search by title and status, rename,
archive and restore, each through the Sessions API from the browser (Chromium against a real
`runstack`)."""

import re

from .test_workspace import SESSION_URL, expect, log_in


def create_session(page, title: str) -> str:
    page.goto("/")
    page.get_by_test_id("new-session-title").fill(title)
    page.get_by_test_id("new-session-submit").click()
    expect(page).to_have_url(SESSION_URL)
    return page.url.rstrip("/").rsplit("/", 1)[-1]


def row(page, session_id: str):
    return page.locator(f"[data-testid=session-row][data-id='{session_id}']")


def test_search_rename_archive_and_restore(page):
    log_in(page)
    first = create_session(page, "Invoices for March")
    second = create_session(page, "Onboarding checklist")
    page.goto("/")
    expect(row(page, first)).to_be_visible()

    # Search narrows the list to matching titles; a status filter applies at once.
    page.get_by_test_id("session-search").fill("invoices")
    expect(row(page, second)).to_have_count(0)
    expect(row(page, first)).to_be_visible()
    page.get_by_test_id("session-status-filter").select_option("running")
    expect(row(page, first)).to_have_count(0)
    expect(page.locator("#sessions-state")).to_contain_text("No Session matches")
    page.get_by_test_id("session-status-filter").select_option("")
    page.get_by_test_id("session-search").fill("")
    expect(row(page, second)).to_be_visible()

    # Rename in place: the row shows what the server kept.
    row(page, first).get_by_test_id("rename-session").click()
    page.get_by_test_id("rename-input").fill("Invoices for April")
    page.get_by_test_id("rename-save").click()
    expect(row(page, first)).to_contain_text("Invoices for April")
    expect(page.locator("#sessions-state")).to_contain_text("Renamed")

    # Archive: out of the list, found under "Archived", restored back.
    row(page, first).get_by_test_id("archive-session").click()
    expect(row(page, first)).to_have_count(0)
    expect(page.locator("#sessions-state")).to_contain_text("Archived “Invoices for April”")
    page.get_by_test_id("session-archived").check()
    expect(row(page, first)).to_be_visible()
    expect(row(page, second)).to_have_count(0)
    row(page, first).get_by_test_id("restore-session").click()
    expect(row(page, first)).to_have_count(0)
    expect(page.locator("#sessions-state")).to_contain_text("Restored")
    page.get_by_test_id("session-archived").uncheck()
    expect(row(page, first)).to_be_visible()
    row(page, first).locator("a.session-link").click()
    expect(page).to_have_url(re.compile(rf"/sessions/{first}/$"))
