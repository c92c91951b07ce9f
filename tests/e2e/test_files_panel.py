"""The Session page's files panel, previews and delivery card in Chromium, against the real
`runstack` (daphne + in-process worker, scripted demo model).

- Uploads by drag-and-drop (a `drop` event carrying a DataTransfer built in the page), the tree
  following `file.changed` live while the demo model writes report.html and kpis.csv, the
  delivery card with the product's own checks, and downloads.
- Every preview kind (HTML in a sandboxed iframe, CSV table, Markdown, image and SVG, text),
  the counts of a file read only in part, and a preview whose file is deleted under it.
- HTML previews run no script until the person asks; with scripts on, the sandbox still cannot
  read the app's cookies or its page.
- A Session created on the home page with a file attached: the upload, then the first task.
- Hostile names stay text; deletion asks first.
- Tool cards of a repeated call id stay with their own turn; a failed model call is told in
  the timeline; a goal typed in "New session" is the first input; nothing overflows at 390 px,
  and the page ends where its content ends (at 1366 and 390 px).
"""

import base64
import json
import re
import struct
import zlib
from pathlib import Path

import pytest

from ..integration.processes import served_embedded
from .test_workspace import (
    LIVE_TIMEOUT_MS,
    SESSION_URL,
    assistant_messages,
    expect,
    log_in,
)

DEMO_DATA = Path(__file__).resolve().parents[2] / "sessions_app" / "demo_data"
REPORT_REQUEST = "Make the weekly support KPI report"
PAGE_TIMEOUT_MS = 30_000
BROKEN_MODEL = "unreachable"

# A model configuration whose endpoint is a closed loopback port: every call fails at once.
CREATE_BROKEN_MODEL = f"""
from sessions_app.models import ModelConfig
from tenancy_app.models import Tenant
ModelConfig.objects.get_or_create(
    tenant=Tenant.objects.get(slug="demo"), name="{BROKEN_MODEL}",
    defaults=dict(base_url="http://127.0.0.1:9/v1", model="nothing-listens", configured_by_operator=True),
)
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("files-stack")
    with served_embedded(root, ("seed_demo",), ("shell", "-c", CREATE_BROKEN_MODEL)) as served:
        yield served


@pytest.fixture(autouse=True)
def _patient_expect():
    expect.set_options(timeout=PAGE_TIMEOUT_MS)
    yield
    expect.set_options(timeout=5_000)


@pytest.fixture
def open_page(browser, stack):
    """open_page(viewport=...) -> a logged-in page; JS errors and 404s fail the test."""
    contexts, errors, missing, dialogs = [], [], [], []

    def open_one(viewport=None):
        context = browser.new_context(
            base_url=stack.base, viewport=viewport or {"width": 1360, "height": 900}, accept_downloads=True
        )
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
        page.on("dialog", lambda dialog: dialogs.append(dialog.message))
        page.dialogs = dialogs
        log_in(page)
        return page

    yield open_one
    for context in contexts:
        context.close()
    assert not errors, (
        f"JavaScript errors in the page: {errors}\n{stack.log.read_text(errors='replace')[-3000:]}"
    )
    assert not missing, f"404s while the page ran: {missing}"


def new_session(page, title, goal=None):
    page.goto("/")
    page.get_by_test_id("new-session-title").fill(title)
    if goal is not None:
        page.get_by_test_id("new-session-goal").fill(goal)
    page.get_by_test_id("new-session-submit").click()
    expect(page).to_have_url(SESSION_URL)
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
    return page.url.rstrip("/").rsplit("/", 1)[-1]


# Drops files on the panel exactly as a browser does: dragenter, dragover, drop, each carrying
# one DataTransfer of File objects.
DROP_FILES = """([selector, files]) => {
  const transfer = new DataTransfer();
  for (const file of files) {
    const bytes = Uint8Array.from(atob(file.base64), (c) => c.charCodeAt(0));
    transfer.items.add(new File([bytes], file.name, { type: file.type || "" }));
  }
  const target = document.querySelector(selector);
  for (const type of ["dragenter", "dragover", "drop"]) {
    target.dispatchEvent(new DragEvent(type, { dataTransfer: transfer, bubbles: true, cancelable: true }));
  }
}"""


def drop_files(page, *files, on="[data-testid=files-panel] .file-tree"):
    """files: (name, bytes or str, mime type); `on`: the element they are dropped on."""
    payload = [
        {
            "name": name,
            "base64": base64.b64encode(content.encode() if isinstance(content, str) else content).decode(),
            "type": mime,
        }
        for name, content, mime in files
    ]
    page.evaluate(DROP_FILES, [on, payload])


# How far the document scrolls past the end of <main> (or of the window): an absolutely
# positioned element that escaped its scroll box shows up here as blank page below the grid.
PAGE_OVERHANG = """() => {
  const root = document.documentElement;
  const end = Math.max(root.clientHeight, document.querySelector("main").getBoundingClientRect().bottom + window.scrollY);
  return root.scrollHeight - Math.ceil(end);
}"""


def assert_no_blank_page_below(page, label):
    overhang = page.evaluate(PAGE_OVERHANG)
    assert overhang <= 4, (label, overhang)


def csrf_of(page):
    return next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")


def file_row(page, path):
    return page.locator(f"[data-testid=file-row][data-path={json.dumps(path)}]")


def open_preview(page, path):
    file_row(page, path).get_by_test_id("file-open").click()
    preview = page.get_by_test_id("file-preview")
    expect(preview).to_be_visible()
    expect(preview).to_have_attribute("data-path", path)
    return preview


def tiny_png(width=3, height=2):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + b"\xd0\x30\x30" * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def test_the_report_run_fills_the_tree_live_with_a_checked_delivery(open_page, tmp_path):
    """S1/S11 in the browser: tickets.csv dropped on the panel, the demo model writes the report,
    the tree follows live, the delivery card lists both files with passing checks, both preview,
    and kpis.csv downloads with the bytes the workspace holds."""
    page = open_page(viewport={"width": 1366, "height": 768})
    session_id = new_session(page, "Files: weekly report")
    expect(page.get_by_test_id("files-empty")).to_be_visible()

    tickets = (DEMO_DATA / "tickets.csv").read_bytes()
    drop_files(page, ("tickets.csv", tickets, "text/csv"))
    upload = page.get_by_test_id("upload").filter(has_text="tickets.csv")
    expect(upload).to_have_attribute("data-state", "done")
    expect(file_row(page, "tickets.csv")).to_be_visible()
    expect(page.get_by_test_id("files-empty")).to_be_hidden()

    page.get_by_test_id("composer-input").fill(REPORT_REQUEST)
    page.get_by_test_id("send-button").click()

    # Written by the agent's fs_write calls, shown by `file.changed` without a reload.
    expect(file_row(page, "report.html")).to_be_visible(timeout=LIVE_TIMEOUT_MS)
    expect(file_row(page, "kpis.csv")).to_be_visible(timeout=LIVE_TIMEOUT_MS)

    card = page.get_by_test_id("delivery-card")
    expect(card).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(card).to_contain_text("machine-checked")
    # The answer is the message just above: the card shows its opening, the rest on request.
    answer = card.get_by_test_id("delivery-answer")
    expect(answer).to_contain_text("report.html")
    full_answer = (
        page.locator("[data-testid=message][data-role=assistant]").last.locator(".message-body").inner_text()
    )
    excerpt = answer.get_by_test_id("delivery-answer-excerpt")
    expect(excerpt).to_be_visible()
    assert len(excerpt.inner_text()) <= 200 < len(full_answer), (excerpt.inner_text(), full_answer)
    expect(answer.get_by_test_id("delivery-answer-full")).to_be_hidden()
    answer.locator("summary").click()
    expect(answer.get_by_test_id("delivery-answer-full")).to_be_visible()
    expect(answer.get_by_test_id("delivery-answer-full")).to_have_text(full_answer)
    expect(excerpt).to_be_hidden()
    answer.locator("summary").click()
    files = card.get_by_test_id("delivery-files")
    expect(files).to_contain_text("report.html")
    expect(files).to_contain_text("kpis.csv")
    expect(files).to_contain_text("sha256")
    checks = card.get_by_test_id("delivery-check")
    expect(checks.first).to_be_visible()
    assert checks.count() >= 2
    for index in range(checks.count()):
        expect(checks.nth(index)).to_have_attribute("data-ok", "true")
        expect(checks.nth(index).locator(".check-mark")).to_have_text("✓")
    expect(card).to_have_attribute("data-checks-ok", "true")
    expect(page.get_by_test_id("session-status")).to_have_attribute(
        "data-status", "idle", timeout=LIVE_TIMEOUT_MS
    )
    card.screenshot(path=str(tmp_path / "delivery-card.png"))
    # A delivery card and a plan are on the page: it still ends where its content ends.
    expect(page.get_by_test_id("plan-task").first).to_be_attached()
    assert_no_blank_page_below(page, "1366 px")
    page.set_viewport_size({"width": 390, "height": 844})
    assert_no_blank_page_below(page, "390 px")
    page.set_viewport_size({"width": 1366, "height": 768})
    # The card follows the answer it checks.
    assert card.evaluate("(node) => node.previousElementSibling.dataset.role") == "assistant"

    preview = open_preview(page, "report.html")
    expect(preview).to_have_attribute("data-kind", "html")
    frame = page.frame_locator("[data-testid=preview-frame]")
    expect(frame.locator("h1")).to_have_text("Support weekly report")
    expect(frame.locator("#kpis")).to_contain_text("Tickets")
    assert page.get_by_test_id("preview-frame").get_attribute("sandbox") == ""

    # From the delivery card straight to the file.
    card.get_by_role("button", name="kpis.csv").click()
    expect(preview).to_have_attribute("data-kind", "csv")
    expect(page.get_by_test_id("csv-summary")).to_have_text(re.compile(r"^\d+ rows × 2 columns"))
    expect(page.get_by_test_id("csv-table").locator("th")).to_have_text(["metric", "value"])
    expect(page.get_by_test_id("csv-table")).to_contain_text("tickets_total")

    with page.expect_download() as info:
        file_row(page, "kpis.csv").get_by_test_id("file-download").click()
    download = info.value
    assert download.suggested_filename == "kpis.csv"
    saved = tmp_path / "kpis.csv"
    download.save_as(saved)
    workspace_copy = page.request.get(f"/api/v1/sessions/{session_id}/files/kpis.csv").body()
    assert saved.read_bytes() == workspace_copy and b"tickets_total" in workspace_copy

    page.screenshot(path=str(tmp_path / "files-panel.png"), full_page=True)

    # A reload rebuilds the card from the deliveries list, in the same place.
    page.reload()
    expect(page.get_by_test_id("delivery-card")).to_have_count(1)
    expect(page.get_by_test_id("delivery-card")).to_have_attribute("data-checks-ok", "true")
    assert (
        page.get_by_test_id("delivery-card").evaluate("(n) => n.previousElementSibling.dataset.role")
        == "assistant"
    )
    expect(page.locator("[data-testid=file-row][data-kind=file]")).to_have_count(3)


def test_every_preview_kind_renders(open_page):
    page = open_page()
    new_session(page, "Files: previews")
    markdown = (
        "# Guide title\n\n- first point\n- second point\n\n`inline code`\n\n"
        '<script>window.__md_script = 1</script><img src=x onerror="window.__md_img = 1">\n'
    )
    text = "alpha line\nbeta line\ngamma <b>line</b>\n"
    csv_text = "name,score,city\nAda,3,<b>Paris</b>\nBob,5,Lyon\n"
    html = "<!doctype html><title>t</title><h1 id=greeting>Hello from a sandbox</h1>"
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="40" height="20"><rect width="40" height="20" fill="teal"/>'
        "<script>parent.__svg_script = 1</script></svg>"
    )
    drop_files(
        page,
        ("guide.md", markdown, "text/markdown"),
        ("notes.txt", text, "text/plain"),
        ("scores.csv", csv_text, "text/csv"),
        ("pixel.png", tiny_png(), "image/png"),
        ("page.html", html, "text/html"),
        ("shape.svg", svg, "image/svg+xml"),
    )
    for name in ("guide.md", "notes.txt", "scores.csv", "pixel.png", "page.html", "shape.svg"):
        expect(file_row(page, name)).to_be_visible()

    preview = open_preview(page, "guide.md")
    expect(preview).to_have_attribute("data-kind", "markdown")
    body = page.get_by_test_id("preview-markdown")
    expect(body.locator("h1")).to_have_text("Guide title")
    expect(body.locator("li")).to_have_text(["first point", "second point"])
    expect(body.locator("code")).to_have_text("inline code")
    expect(body.locator("script, img[onerror], [onerror]")).to_have_count(0)
    assert page.evaluate("[window.__md_script, window.__md_img]") == [None, None]

    open_preview(page, "notes.txt")
    expect(preview).to_have_attribute("data-kind", "text")
    lines = page.get_by_test_id("preview-text").locator(".code-line")
    expect(lines).to_have_text(["alpha line", "beta line", "gamma <b>line</b>"])
    expect(page.get_by_test_id("text-summary")).to_have_text("3 lines")
    expect(page.get_by_test_id("preview-text").locator("b")).to_have_count(0)
    # Line numbers come from CSS counters: shown, never part of the copied text.
    numbers = lines.evaluate_all("(rows) => rows.map((r) => getComputedStyle(r, '::before').content)")
    assert numbers == ["counter(line)"] * 3 or all(n.strip('"').isdigit() for n in numbers), numbers

    open_preview(page, "scores.csv")
    expect(preview).to_have_attribute("data-kind", "csv")
    expect(page.get_by_test_id("csv-summary")).to_have_text("2 rows × 3 columns")
    table = page.get_by_test_id("csv-table")
    expect(table.locator("th")).to_have_text(["name", "score", "city"])
    expect(table.locator("tbody tr")).to_have_count(2)
    expect(table.locator("tbody tr").first.locator("td")).to_have_text(["Ada", "3", "<b>Paris</b>"])
    expect(table.locator("b")).to_have_count(0)

    open_preview(page, "pixel.png")
    expect(preview).to_have_attribute("data-kind", "image")
    image = page.get_by_test_id("preview-image")
    expect(image).to_be_visible()
    page.wait_for_function(
        "() => { const i = document.querySelector('[data-testid=preview-image]'); return i && i.complete && i.naturalWidth > 0; }"
    )
    assert image.evaluate("(i) => [i.naturalWidth, i.naturalHeight]") == [3, 2]

    # SVG is an image: drawn by <img>, which never runs the script inside it.
    open_preview(page, "shape.svg")
    expect(preview).to_have_attribute("data-kind", "image")
    page.wait_for_function(
        "() => { const i = document.querySelector('[data-testid=preview-image]');"
        " return i && i.complete && i.naturalWidth > 0 && i.src.includes('shape.svg'); }"
    )
    assert image.evaluate("(i) => [i.naturalWidth, i.naturalHeight]") == [40, 20]
    assert page.evaluate("window.__svg_script") is None

    open_preview(page, "page.html")
    expect(preview).to_have_attribute("data-kind", "html")
    expect(page.frame_locator("[data-testid=preview-frame]").locator("#greeting")).to_have_text(
        "Hello from a sandbox"
    )
    assert page.get_by_test_id("preview-frame").get_attribute("sandbox") == ""

    page.get_by_test_id("preview-close").click()
    expect(preview).to_be_hidden()


def test_counts_of_a_file_read_in_part_say_at_least(open_page):
    """The preview reads the first 256 KB: counts over that part are lower bounds, and say so."""
    page = open_page()
    new_session(page, "Files: big files")
    big_csv = "id,label\n" + "".join(f"{i},row number {i}\n" for i in range(20_000))
    big_text = "".join(f"line {i} of a long log\n" for i in range(20_000))
    assert len(big_csv) > 256 * 1024 and len(big_text) > 256 * 1024
    drop_files(page, ("big.csv", big_csv, "text/csv"), ("big.log", big_text, "text/plain"))
    expect(file_row(page, "big.log")).to_be_visible()

    open_preview(page, "big.csv")
    summary = page.get_by_test_id("csv-summary")
    expect(summary).to_have_text(
        re.compile(r"^at least \d+ rows × 2 columns \(first 256 KB read\) — showing the first 100$")
    )
    counted = int(re.search(r"\d+", summary.inner_text()).group())
    assert 10_000 < counted < 20_000, counted
    expect(page.get_by_test_id("csv-table").locator("tbody tr")).to_have_count(100)

    open_preview(page, "big.log")
    expect(page.get_by_test_id("text-summary")).to_have_text(
        re.compile(
            r"^at least \d+ lines \(first 256 KB read\) — showing the first \d+; download the file for the rest$"
        )
    )

    # Small enough to read whole: exact counts, and "showing the first 100" only when more exist.
    drop_files(page, ("rows.csv", "n\n" + "".join(f"{i}\n" for i in range(150)), "text/csv"))
    expect(file_row(page, "rows.csv")).to_be_visible()
    open_preview(page, "rows.csv")
    expect(page.get_by_test_id("csv-summary")).to_have_text("150 rows × 1 column — showing the first 100")


def test_a_preview_whose_file_is_deleted_says_so_and_offers_no_download(open_page):
    page = open_page()
    session_id = new_session(page, "Files: deleted under the preview")
    drop_files(page, ("notes.md", "# Notes\n\nsome text\n", "text/markdown"))
    expect(file_row(page, "notes.md")).to_be_visible()
    preview = open_preview(page, "notes.md")
    meta = page.get_by_test_id("preview-meta")
    download = page.get_by_test_id("preview-download")
    expect(meta).to_contain_text("markdown")
    expect(download).to_be_visible()

    # Deleted elsewhere (another tab, the agent): the open preview learns it from `file.changed`.
    gone = page.request.delete(
        f"/api/v1/sessions/{session_id}/files/notes.md", headers={"X-CSRFToken": csrf_of(page)}
    )
    assert gone.status == 204, gone.text()
    expect(page.get_by_test_id("preview-body")).to_have_text("This file was deleted from the workspace.")
    expect(preview).to_have_attribute("data-state", "gone")
    expect(meta).not_to_contain_text("markdown")
    expect(meta).not_to_contain_text(" B")
    expect(download).to_be_hidden()
    assert download.get_attribute("href") is None
    expect(file_row(page, "notes.md")).to_have_count(0)

    # Written again at the same path: the preview comes back, Download with it.
    drop_files(page, ("notes.md", "# Back\n", "text/markdown"))
    expect(page.get_by_test_id("preview-markdown").locator("h1")).to_have_text("Back")
    expect(download).to_be_visible()
    expect(meta).to_contain_text("markdown")


# Runs inside the previewed file: what can it read of the app?
COOKIE_SPY = """<!doctype html><html><body><p id="out">pending</p><script>
let result = "";
try { result += "own=" + JSON.stringify(document.cookie); } catch (e) { result += "own-blocked:" + e.name; }
try { result += " parent=" + JSON.stringify(window.parent.document.cookie); } catch (e) { result += " parent-blocked:" + e.name; }
try { result += " storage=" + String(window.localStorage.length); } catch (e) { result += " storage-blocked:" + e.name; }
document.getElementById("out").textContent = result;
</script></body></html>"""


def test_the_html_preview_runs_no_script_until_asked_and_then_cannot_read_the_apps_cookies(open_page):
    page = open_page()
    session_id = new_session(page, "Files: cookie spy")
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    assert cookies.get("sessionid") and cookies.get("csrftoken")
    page.evaluate("document.cookie.length")  # the app itself can read its CSRF cookie
    drop_files(page, ("spy.html", COOKIE_SPY, "text/html"))
    expect(file_row(page, "spy.html")).to_be_visible()

    # By default the page is shown, but its script does not run.
    open_preview(page, "spy.html")
    frame = page.get_by_test_id("preview-frame")
    assert frame.get_attribute("sandbox") == ""
    assert "scripts=1" not in frame.get_attribute("src")
    out = page.frame_locator("[data-testid=preview-frame]").locator("#out")
    expect(out).to_have_text("pending")
    page.wait_for_timeout(1000)
    expect(out).to_have_text("pending")
    expect(page.get_by_test_id("preview-scripts-warning")).to_have_text(
        "Scripts run in an isolated sandbox without your cookies, but a page can still navigate away "
        "and send its own content. Run scripts only for pages you trust."
    )

    # Asked for, the scripts run: still in an opaque origin that cannot read the app.
    run = page.get_by_role("button", name="Run the page's scripts")
    run.click()
    expect(frame).to_have_attribute("sandbox", "allow-scripts")
    assert "scripts=1" in frame.get_attribute("src")
    expect(out).not_to_have_text("pending")
    reported = out.inner_text()
    assert "own-blocked:SecurityError" in reported or 'own=""' in reported, reported
    assert "parent-blocked:SecurityError" in reported, reported
    assert "storage=" not in reported or "storage-blocked" in reported, reported
    for secret in (cookies["sessionid"], cookies["csrftoken"]):
        assert secret not in reported

    # And off again.
    page.get_by_role("button", name="Turn the scripts off").click()
    expect(frame).to_have_attribute("sandbox", "")
    expect(out).to_have_text("pending")

    # Opened on its own, the raw route carries its own sandbox: scripts only with ?scripts=1.
    raw = page.request.get(f"/api/v1/sessions/{session_id}/files/spy.html")
    assert "sandbox" in raw.headers["content-security-policy"]
    assert "allow-scripts" not in raw.headers["content-security-policy"]
    assert raw.headers["x-frame-options"] == "SAMEORIGIN"
    with_scripts = page.request.get(f"/api/v1/sessions/{session_id}/files/spy.html?scripts=1")
    assert "sandbox allow-scripts" in with_scripts.headers["content-security-policy"]


def test_a_hostile_file_name_is_shown_as_text(open_page):
    page = open_page()
    new_session(page, "Files: hostile name")
    name = "<img src=x onerror=alert(1)>.html"
    drop_files(page, (name, "<p>harmless</p>", "text/html"))
    row = file_row(page, name)
    expect(row).to_be_visible()
    expect(row.locator(".file-name")).to_have_text(name)
    expect(page.get_by_test_id("file-tree").locator("img")).to_have_count(0)

    open_preview(page, name)
    expect(page.get_by_test_id("preview-name")).to_have_text(name)
    expect(page.get_by_test_id("file-preview").locator(".preview-head img")).to_have_count(0)
    expect(page.frame_locator("[data-testid=preview-frame]").locator("p")).to_have_text("harmless")
    assert page.dialogs == [], page.dialogs


def test_deleting_a_file_asks_first(open_page):
    page = open_page()
    new_session(page, "Files: delete")
    drop_files(page, ("keep.txt", "keep me\n", "text/plain"), ("scratch.txt", "bye\n", "text/plain"))
    expect(file_row(page, "scratch.txt")).to_be_visible()
    expect(file_row(page, "keep.txt")).to_be_visible()

    page.once("dialog", lambda dialog: dialog.dismiss())
    file_row(page, "keep.txt").get_by_test_id("file-delete").click()
    page.wait_for_timeout(500)
    expect(file_row(page, "keep.txt")).to_be_visible()

    page.once("dialog", lambda dialog: dialog.accept())
    file_row(page, "scratch.txt").get_by_test_id("file-delete").click()
    expect(file_row(page, "scratch.txt")).to_have_count(0)
    expect(file_row(page, "keep.txt")).to_be_visible()
    assert any("scratch.txt" in message for message in page.dialogs), page.dialogs


def test_uploads_go_into_a_folder_or_say_why_they_were_refused(open_page):
    page = open_page()
    session_id = new_session(page, "Files: refused upload")
    drop_files(page, ("a.txt", "x", "text/plain"))
    expect(file_row(page, "a.txt")).to_be_visible()
    # A directory stands where the file would go: the API refuses, the panel shows its message.
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    made = page.request.post(
        f"/api/v1/sessions/{session_id}/files/",
        multipart={
            "file": {"name": "inner.txt", "mimeType": "text/plain", "buffer": b"x"},
            "path": "dir/inner.txt",
        },
        headers={"X-CSRFToken": csrf},
    )
    assert made.status == 201, made.text()
    expect(file_row(page, "dir")).to_be_visible()
    drop_files(page, ("dir", "not a directory", "text/plain"))
    failed = page.get_by_test_id("upload").filter(has_text="dir").last
    expect(failed).to_have_attribute("data-state", "error")
    expect(failed.locator(".upload-status")).to_contain_text("is a directory")

    # Dropped on the folder's row, a file goes into that folder.
    drop_files(page, ("second.txt", "2\n", "text/plain"), on='[data-testid=file-row][data-path="dir"]')
    expect(file_row(page, "dir/second.txt")).to_be_visible()
    expect(file_row(page, "dir/second.txt").locator(".file-name")).to_have_text("second.txt")


def test_tool_cards_stay_with_their_own_turn(open_page):
    """The demo model reuses its call ids in every report turn: the second turn gets cards of
    its own, and the first turn's cards keep their results."""
    page = open_page()
    new_session(page, "Files: two turns")
    drop_files(page, ("tickets.csv", (DEMO_DATA / "tickets.csv").read_bytes(), "text/csv"))
    expect(file_row(page, "tickets.csv")).to_be_visible()
    status = page.get_by_test_id("session-status")
    for turn in (1, 2):
        page.get_by_test_id("composer-input").fill(REPORT_REQUEST)
        page.get_by_test_id("send-button").click()
        expect(page.get_by_test_id("delivery-card")).to_have_count(turn, timeout=LIVE_TIMEOUT_MS)
        expect(status).to_have_attribute("data-status", "idle", timeout=LIVE_TIMEOUT_MS)

    def check():
        writes = page.locator("[data-testid=tool-card][data-tool=fs_write]")
        expect(writes).to_have_count(4)
        for index in range(4):
            expect(writes.nth(index)).to_have_attribute("data-ok", "true")
        plans = page.locator("[data-testid=tool-card][data-tool=plan_create]")
        expect(plans).to_have_count(2)
        turns = plans.evaluate_all(
            "(cards) => cards.map((c) => c.closest('[data-testid=message]').dataset.turn)"
        )
        assert len(set(turns)) == 2, turns
        for card in page.get_by_test_id("tool-card").all():
            assert card.evaluate("(c) => c.dataset.turn === c.closest('[data-testid=message]').dataset.turn")

    check()
    page.reload()
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
    check()


def test_a_failed_model_call_is_told_in_the_timeline(open_page, tmp_path):
    page = open_page()
    page.goto("/")
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    created = page.request.post(
        "/api/v1/sessions/",
        data={"title": "Broken model", "model": BROKEN_MODEL},
        headers={"X-CSRFToken": csrf},
    )
    assert created.status == 201, created.text()
    page.goto(f"/sessions/{created.json()['id']}/")
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")

    page.get_by_test_id("composer-input").fill("hello")
    page.get_by_test_id("send-button").click()
    note = page.get_by_test_id("turn-error")
    expect(note).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(note).to_contain_text(re.compile(r"model call failed", re.IGNORECASE))
    expect(note).to_have_attribute("data-reason", "error")
    # Once the turn is over, the composer's "queued" note is no longer news.
    expect(page.locator("#composer-note")).to_have_text("")
    expect(page.get_by_test_id("phase-goal-state")).to_be_hidden()  # no turn works on it now
    page.locator(".conversation").screenshot(path=str(tmp_path / "failed-turn.png"))

    page.reload()
    expect(page.get_by_test_id("turn-error")).to_have_count(1)


def test_a_goal_typed_in_new_session_is_the_first_input(open_page):
    page = open_page()
    goal = "hello, this is the first task"
    session_id = new_session(page, "Goal first", goal=goal)
    first = page.locator("[data-testid=message][data-role=user]").first
    expect(first).to_contain_text(goal, timeout=LIVE_TIMEOUT_MS)
    expect(assistant_messages(page)).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    messages = page.request.get(f"/api/v1/sessions/{session_id}/messages/").json()["results"]
    users = [m for m in messages if m["role"] == "user"]
    assert len(users) == 1 and goal in users[0]["content"], users
    session = page.request.get(f"/api/v1/sessions/{session_id}/").json()
    assert session["session_goal"] == goal


def test_a_session_started_from_home_with_tickets_csv_attached_delivers(open_page):
    """The demo's first run from the home page: the file goes up with the form, so the first
    turn can read it and ends with a checked report."""
    page = open_page()
    page.goto("/")
    goal = page.get_by_test_id("new-session-goal")
    assert "attach" in goal.get_attribute("placeholder")
    page.get_by_test_id("new-session-title").fill("Home: weekly report")
    goal.fill("Make the weekly support KPI report from tickets.csv")
    page.get_by_test_id("new-session-files").set_input_files(str(DEMO_DATA / "tickets.csv"))
    page.get_by_test_id("new-session-submit").click()
    expect(page).to_have_url(SESSION_URL)
    session_id = page.url.rstrip("/").rsplit("/", 1)[-1]

    expect(file_row(page, "tickets.csv")).to_be_visible()
    expect(file_row(page, "report.html")).to_be_visible(timeout=LIVE_TIMEOUT_MS)
    card = page.get_by_test_id("delivery-card")
    expect(card).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(card).to_have_attribute("data-checks-ok", "true")
    assert card.locator(".delivery-icon").evaluate("(n) => getComputedStyle(n).color") == "rgb(31, 122, 61)"
    inputs = page.request.get(f"/api/v1/sessions/{session_id}/messages/").json()["results"]
    first = next(m for m in inputs if m["role"] == "user")
    assert "tickets.csv" in first["content"], first


def test_a_refused_upload_on_home_says_which_file_and_a_retry_reuses_the_session(open_page):
    page = open_page()
    page.goto("/")
    title = "Home: refused upload"
    page.get_by_test_id("new-session-title").fill(title)
    page.get_by_test_id("new-session-goal").fill("hello")
    good = {"name": "good.txt", "mimeType": "text/plain", "buffer": b"fine\n"}
    bad = {"name": "..", "mimeType": "text/plain", "buffer": b"x"}  # no usable name: refused
    page.get_by_test_id("new-session-files").set_input_files([good, bad])
    page.get_by_test_id("new-session-submit").click()

    error = page.get_by_test_id("new-session-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("1 of 2 files could not be uploaded")
    expect(error.locator("li")).to_have_count(1)
    expect(error.locator("li strong")).to_have_text("..")
    expect(error.locator("li")).to_contain_text("file")  # the API's own reason
    uploads = page.get_by_test_id("new-session-uploads").get_by_test_id("upload")
    expect(uploads.filter(has_text="good.txt")).to_have_attribute("data-state", "done")
    expect(uploads.filter(has_text="..")).to_have_attribute("data-state", "error")
    assert not SESSION_URL.search(page.url), page.url  # still on the home page
    expect(page.get_by_test_id("open-unfinished-session")).to_be_visible()
    submit = page.get_by_test_id("new-session-submit")
    expect(submit).to_have_text("Retry the upload")

    # Without the refused file, the retry finishes the same Session.
    page.get_by_test_id("new-session-files").set_input_files([good])
    submit.click()
    expect(page).to_have_url(SESSION_URL)
    expect(file_row(page, "good.txt")).to_be_visible()
    sessions = page.request.get("/api/v1/sessions/?page_size=100").json()["results"]
    assert [s["title"] for s in sessions].count(title) == 1
    first = page.locator("[data-testid=message][data-role=user]").first
    expect(first).to_contain_text("hello", timeout=LIVE_TIMEOUT_MS)


def test_nothing_overflows_at_390_px(open_page, tmp_path):
    page = open_page(viewport={"width": 390, "height": 844})
    widths = "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    scroll, client = page.evaluate(widths)
    assert scroll <= client, ("home", scroll, client)

    new_session(page, "A rather long Session title that has to wrap on a phone screen somehow")
    drop_files(page, ("wide.csv", "a,b,c,d,e,f,g,h\n" + "1234567890," * 7 + "1\n", "text/csv"))
    expect(file_row(page, "wide.csv")).to_be_visible()
    open_preview(page, "wide.csv")
    expect(page.get_by_test_id("csv-table")).to_be_visible()
    scroll, client = page.evaluate(widths)
    assert scroll <= client, ("session", scroll, client)
    page.screenshot(path=str(tmp_path / "phone.png"), full_page=True)
    header = page.locator(".topbar").bounding_box()
    assert header["width"] <= 390, header

    # The favicon is ours, and a client asking for /favicon.ico does not get a 404.
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert icon.endswith(".svg") and page.request.get(icon).ok
    assert page.request.get("/favicon.ico").ok


def test_a_delivery_with_a_failed_read_shows_it_in_red(open_page, tmp_path):
    """S11 without tickets.csv: the read fails, and the card says so in red, as a machine check."""
    page = open_page()
    new_session(page, "Files: no tickets")
    page.get_by_test_id("composer-input").fill(REPORT_REQUEST)
    page.get_by_test_id("send-button").click()
    card = page.get_by_test_id("delivery-card")
    expect(card).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(card).to_have_attribute("data-checks-ok", "false")
    failures = card.get_by_test_id("delivery-failures")
    expect(failures).to_contain_text("fs_read")
    assert failures.locator("li").first.evaluate("(li) => getComputedStyle(li).color") == "rgb(179, 38, 30)"
    expect(card.get_by_test_id("delivery-verdict")).to_contain_text("unresolved tool failure")
    expect(page.get_by_test_id("file-row")).to_have_count(0)
    card.screenshot(path=str(tmp_path / "failed-delivery.png"))


def test_a_turn_that_delivered_nothing_gets_a_neutral_card(open_page):
    """A turn of words only (the demo explains itself) checked nothing: no green tick."""
    page = open_page()
    new_session(page, "Files: words only")
    page.get_by_test_id("composer-input").fill("What can you do?")
    page.get_by_test_id("send-button").click()
    card = page.get_by_test_id("delivery-card")
    expect(card).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(card).to_have_attribute("data-outcome", "nothing_delivered")
    expect(card.get_by_test_id("delivery-verdict")).to_have_text(
        "nothing delivered: no file written, nothing to check"
    )
    expect(card.locator(".delivery-icon")).to_have_text("○")
    green = "rgb(31, 122, 61)"  # --ok
    assert card.locator(".delivery-verdict").evaluate("(node) => getComputedStyle(node).color") != green
