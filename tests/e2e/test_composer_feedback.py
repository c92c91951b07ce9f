"""What the Session page says instead of doing nothing: an empty message, a message over the
limit (counted as you type, kept whole, Send says why), a long message collapsed with "Show
all", and a long or changed file name on upload (Chromium against a real `runstack`)."""

import re

from .test_workspace import LIVE_TIMEOUT_MS, SESSION_URL, assistant_messages, expect, log_in

INPUT_MAX = 100_000


def open_new_session(page, title: str) -> None:
    log_in(page)
    page.get_by_test_id("new-session-title").fill(title)
    page.get_by_test_id("new-session-submit").click()
    expect(page).to_have_url(SESSION_URL)
    # The page modules and files.js are running (the socket is up) before anything is clicked.
    expect(page.get_by_test_id("live-indicator")).to_have_attribute(
        "data-state", "live", timeout=LIVE_TIMEOUT_MS
    )


def test_empty_and_over_limit_messages_are_explained_and_nothing_is_cut(page):
    open_new_session(page, "Composer limits")
    note = page.locator("#composer-note")
    count = page.get_by_test_id("composer-count")

    page.get_by_test_id("send-button").click()
    expect(note).to_have_text(re.compile("Type a message first"))

    # Over the limit: kept whole (no silent cut), counted, and Send explains instead of sending.
    page.get_by_test_id("composer-input").fill("x" * (INPUT_MAX + 50_000))
    assert len(page.get_by_test_id("composer-input").input_value()) == INPUT_MAX + 50_000
    expect(count).to_be_visible()
    expect(count).to_contain_text("50,000 over the limit")
    expect(page.get_by_test_id("send-button")).to_have_attribute("data-blocked", "too-long")
    expect(page.get_by_test_id("send-button")).to_have_attribute("aria-disabled", "true")
    page.get_by_test_id("composer-input").press("Enter")
    expect(note).to_contain_text("Not sent: the message is 50,000 characters over the limit")
    expect(page.locator("[data-testid=message][data-role=user]")).to_have_count(0)

    # Shortened to the limit: the count says so, Send works, the long message shows collapsed.
    page.get_by_test_id("composer-input").fill("word " * (INPUT_MAX // 5))
    expect(count).to_have_text(re.compile(r"100,000 / 100,000 characters$"))
    page.get_by_test_id("send-button").click()
    user_message = page.locator("[data-testid=message][data-role=user]")
    expect(user_message).to_have_count(1)
    expect(count).to_be_hidden()
    body = user_message.locator(".message-body")
    expect(body).to_have_class(re.compile("collapsed"))
    height = body.evaluate("node => node.getBoundingClientRect().height")
    assert height < 400, f"a collapsed message is {height}px tall"
    user_message.get_by_test_id("show-all").click()
    expect(body).not_to_have_class(re.compile("collapsed"))
    expect(user_message.get_by_test_id("show-all")).to_have_text("Show less")
    expect(assistant_messages(page)).to_have_count(1, timeout=LIVE_TIMEOUT_MS)


def test_a_long_file_name_is_cut_on_screen_with_the_whole_name_on_hover(page, tmp_path):
    open_new_session(page, "Long names")
    name = ("quarterly-report-" * 14)[:230] + ".csv"
    upload = tmp_path / name
    upload.write_text("a,b\n1,2\n")
    page.get_by_test_id("upload-input").set_input_files(str(upload))
    # The workspace tree keeps it: one cut line, the whole name on hover.
    opener = page.locator(f"[data-testid=file-open][title='Preview {name}']")
    expect(opener).to_be_visible(timeout=LIVE_TIMEOUT_MS)
    label = opener.locator(".file-name")
    box = label.evaluate("node => [node.getBoundingClientRect().height, node.scrollWidth > node.clientWidth]")
    assert box[0] < 30 and box[1], f"the name should be one cut line, got height/overflow {box}"
    side = page.locator("aside.side").evaluate("node => node.getBoundingClientRect().width")
    assert side < 0.4 * 1360, f"the side column grew to {side}px"


def test_an_upload_whose_name_was_changed_says_so_until_dismissed(page, tmp_path):
    open_new_session(page, "Changed names")
    name = "x" * 300 + ".csv"  # longer than a file name may be: the server shortens it
    upload = tmp_path / "long.csv"
    upload.write_text("a,b\n1,2\n")
    page.get_by_test_id("upload-input").set_input_files(
        {"name": name, "mimeType": "text/csv", "buffer": upload.read_bytes()}
    )
    row = page.locator("[data-testid=upload][data-renamed=true]")
    expect(row).to_be_visible(timeout=LIVE_TIMEOUT_MS)
    expect(row.locator(".upload-name")).to_have_attribute("title", name)
    expect(row.locator(".upload-status")).to_contain_text("the name was changed to")
    expect(row.locator(".upload-status")).to_contain_text("shortened to 255 characters")
    # The new name is one long word: it wraps inside the Files panel, not past its edge.
    overflow = row.evaluate(
        "row => { const s = row.querySelector('.upload-status').getBoundingClientRect();"
        " const panel = row.closest('[data-testid=files-panel], #files-panel').getBoundingClientRect();"
        " return s.right - panel.right; }"
    )
    assert overflow <= 1, f"the upload status runs {overflow}px past the Files panel"
    page.wait_for_timeout(6000)  # past the time a plain "uploaded" row stays
    expect(row).to_be_visible()
    row.locator(".upload-dismiss").click()
    expect(row).to_have_count(0)
