"""The outer task loop on the Session page (issue #13), in Chromium against the real `runstack`
(SQLite, in-process worker); the model is the scripted server on loopback, the demo tenant's
default model configuration (seed_demo imports the `research-guide` Skill).

- a sub-Session's message shows `preparing`, then "Understood as a new task" and what
  orchestration added at its turn; the Capabilities card says the Skill was chosen by
  orchestration; all of it again after a reload;
- the goals panel edits the phase goal in place (a 400 is told inline and nothing changes), the
  edit persists, another tab sees it live, and the timeline says who edited;
- a malformed task-relation answer is a warning note at its turn, and the answer still comes;
- a MainSession that delegates lists its sub-Session (linked both ways), and the result coming
  back is a Session-event notice linking to the sub-Session, not the user's bubble.
"""

import json
import re
from types import SimpleNamespace

import pytest

from tests.support.model_server import ScriptedModelServer, json_reply, text_reply, tool_call, tool_reply

from ..integration.processes import served_embedded
from .test_workspace import LIVE_TIMEOUT_MS, assistant_messages, expect, log_in

RESEARCH_TASK = "Research ComfyUI custom nodes with the research guide."
RESEARCH_ANSWER = "Here is what the research found."
MALFORMED_TASK = "Summarize the ComfyUI release notes (MALFORMED understanding)."
DELEGATE_TASK = "Please delegate: write a guide to ComfyUI nodes."
CHILD_REQUEST = "Write guide.md about ComfyUI nodes."
CHILD_TITLE = "ComfyUI guide"
CHILD_ANSWER = "guide.md is written."
DELEGATED = "A sub-Session works on the guide."
AFTER_EVENT = "The sub-Session delivered guide.md."
UNDERSTANDING_DELAY_S = 1.0  # long enough for the page to show `preparing`
# Recalled by orchestration's memory terms only (no word of the task's text matches it).
MEMORY = "Dana keeps the nodepack mirror."

SETUP = """
from django.contrib.auth import get_user_model
from sessions_app.models import ModelConfig
from sessions_app.runtime import memory
from skills_app.models import Skill
from tenancy_app.models import Tenant

tenant = Tenant.objects.get(slug="demo")
ModelConfig.objects.update_or_create(
    tenant=tenant, name="scripted",
    defaults=dict(base_url="{base_url}", model="scripted-model", is_default=True, configured_by_operator=True),
)
assert Skill.objects.filter(tenant=tenant, name="research-guide").exists()  # seed_demo imports it
demo = get_user_model().objects.get(username="demo")
memory.save(tenant_id=tenant.pk, user_id=demo.pk, text={memory!r}, kind="entity")
"""


SPOOF_TASK = "Tidy the keep folder"
SPOOFED_PATH = "keep/\u202etxt.exe"  # shows as "keep/exe.txt" if the override is obeyed


def _last_user_text(request) -> str:
    users = [m for m in request.messages if m["role"] == "user"]
    return str(users[-1]["content"]) if users else ""


def agent(request):
    """A MainSession delegates when asked; the sub-Session writes guide.md; anything else is a line."""
    messages = request.messages
    text = _last_user_text(request)
    last = messages[-1] if messages else {}
    if text.startswith("[Session event"):
        return text_reply(AFTER_EVENT)
    if last.get("role") == "tool" and last.get("tool_call_id") == "delegate":
        return text_reply(DELEGATED)
    if last.get("role") == "tool" and last.get("tool_call_id") == "write":
        return text_reply(CHILD_ANSWER)
    if SPOOF_TASK in text and last.get("role") != "tool":
        return tool_reply(tool_call("fs_delete_files", {"paths": [SPOOFED_PATH]}, id="spoof"))
    if DELEGATE_TASK in text:
        request_args = {"request": CHILD_REQUEST, "title": CHILD_TITLE}
        return tool_reply(tool_call("session_delegate", request_args, id="delegate"))
    if CHILD_REQUEST in text:
        return tool_reply(
            tool_call("fs_write", {"path": "guide.md", "content": "# ComfyUI nodes\n"}, id="write")
        )
    return text_reply(RESEARCH_ANSWER)


def task_relation(request):
    """A new task first, a new phase after; a message saying MALFORMED gets an answer that is not JSON."""
    asked = json.loads(request.messages[-1]["content"])
    if "MALFORMED" in asked["message"]:
        return text_reply("I think this is a new task.", delay_before_s=UNDERSTANDING_DELAY_S)
    relation = "change_within_session" if asked.get("current_phase_goal") else "new_task"
    terms = ["research", "guide", "comfyui"]
    answer = {
        "task_relation": relation,
        "skill_recall_terms": terms,
        "tool_recall_terms": terms,
        "memory_recall_terms": ["nodepack"],
    }
    return json_reply(answer, delay_before_s=UNDERSTANDING_DELAY_S)


def orchestrate(request):
    """Choose the research guide when it is a candidate, nothing else."""
    candidates = json.loads(request.messages[-1]["content"]).get("candidates") or {}
    skills = [s["name"] for s in candidates.get("skills") or [] if s["name"] == "research-guide"]
    return json_reply({"skills": skills, "toolsets": [], "tools": []})


@pytest.fixture(scope="module")
def model_server():
    with ScriptedModelServer() as server:
        server.default("agent", agent)
        server.default("task_relation", task_relation)
        server.default("orchestrate", orchestrate)
        yield server


@pytest.fixture(scope="module")
def stack(tmp_path_factory, model_server):
    root = tmp_path_factory.mktemp("outer-loop-stack")
    with served_embedded(
        root, ("seed_demo",), ("shell", "-c", SETUP.format(base_url=model_server.base_url, memory=MEMORY))
    ) as served:
        yield SimpleNamespace(**vars(served))


# Records every status (and its reason) the badge shows, as it happens.
WATCH_STATUS = """() => {
  const seen = (window.__statuses = []);
  const badge = document.querySelector("[data-testid=session-status]");
  const reason = document.getElementById("status-reason");
  new MutationObserver(() => seen.push(`${badge.dataset.status}:${reason.textContent}`)).observe(badge, {
    attributes: true, attributeFilter: ["data-status"],
  });
}"""


def csrf_of(page) -> str:
    return next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")


def create_session(page, **body) -> dict:
    created = page.request.post("/api/v1/sessions/", data=body, headers={"X-CSRFToken": csrf_of(page)})
    assert created.status == 201, created.text()
    return created.json()


def open_session(page, session_id):
    page.goto(f"/sessions/{session_id}/")
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")


def send(page, text):
    page.get_by_test_id("composer-input").fill(text)
    page.get_by_test_id("send-button").click()


def wait_idle(page):
    expect(page.get_by_test_id("session-status")).to_have_attribute(
        "data-status", "idle", timeout=LIVE_TIMEOUT_MS
    )


def timeline(page) -> list[str]:
    """The conversation's items in order: messages by role, notes and cards by test id."""
    return page.eval_on_selector_all(
        "#messages > li",
        "items => items.map(li => li.dataset.testid === 'message' ? `message:${li.dataset.kind || li.dataset.role}`"
        " : li.dataset.testid)",
    )


def new_sub_session(page, title) -> tuple[dict, dict]:
    main = create_session(page, title=f"Coordinator of {title}")
    sub = create_session(page, title=title, kind="sub", parent=main["id"])
    return main, sub


def test_a_sub_session_shows_understanding_and_orchestration(page, tmp_path):
    log_in(page)
    main, sub = new_sub_session(page, "Research")
    open_session(page, sub["id"])
    goals = page.get_by_test_id("goals")
    expect(goals.get_by_test_id("goal-value")).to_have_text(["not set yet", "not set yet"])
    expect(page.get_by_test_id("parent-link")).to_have_text(main["title"])

    page.evaluate(WATCH_STATUS)
    send(page, RESEARCH_TASK)
    understood = page.get_by_test_id("task-understood")
    expect(understood).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(understood).to_have_attribute("data-relation", "new_task")
    expect(understood.locator(".turn-note-lines")).to_have_text(
        f"Understood as a new task — phase goal: “{RESEARCH_TASK}”"
    )
    orchestration = page.get_by_test_id("orchestration-note")
    expect(orchestration.locator(".turn-note-lines")).to_have_text(
        "Orchestration (initialize) added: research-guide (skill)"
    )
    expect(assistant_messages(page).last).to_contain_text(RESEARCH_ANSWER, timeout=LIVE_TIMEOUT_MS)
    wait_idle(page)
    assert "preparing:understanding the task" in page.evaluate("window.__statuses"), page.evaluate(
        "window.__statuses"
    )

    card = page.get_by_test_id("capabilities")
    skill = card.locator("[data-testid=capability][data-kind=skills][data-name=research-guide]")
    expect(skill.get_by_test_id("capability-source")).to_have_text("chosen by orchestration")
    expect(skill.get_by_test_id("capability-source")).to_have_attribute("data-source", "orchestrator")
    toolset = card.locator("[data-testid=capability][data-kind=toolsets]")
    expect(toolset.get_by_test_id("capability-source")).to_have_text(["default"])
    expect(page.get_by_test_id("session-goal").get_by_test_id("goal-value")).to_have_text(RESEARCH_TASK)
    expect(page.get_by_test_id("phase-goal").get_by_test_id("goal-value")).to_have_text(RESEARCH_TASK)

    def in_place():
        items = timeline(page)
        # The orchestration note says what `capabilities.added` said: one note, not two (even with
        # the memories orchestration recalled logged between them).
        assert items.count("task-understood") == 1 and items.count("orchestration-note") == 1, items
        assert items.count("capabilities-note") == 1, items  # the default tool set, before any message
        assert items.count("memory-recalled") == 1, items
        user, noted = items.index("message:user"), items.index("task-understood")
        assert user < noted < items.index("memory-recalled") < items.index("orchestration-note"), items
        assert items.index("orchestration-note") < items.index("message:assistant"), items

    in_place()
    page.screenshot(path=str(tmp_path / "sub-session-understood.png"), full_page=True)

    page.reload()
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
    expect(assistant_messages(page).last).to_contain_text(RESEARCH_ANSWER)
    expect(understood.locator(".turn-note-lines")).to_have_text(
        f"Understood as a new task — phase goal: “{RESEARCH_TASK}”"
    )
    expect(orchestration).to_have_count(1)
    expect(skill.get_by_test_id("capability-source")).to_have_text("chosen by orchestration")
    in_place()

    # A second message is a new phase: reconcile finds nothing new (the guide is loaded already).
    send(page, "Now compare ComfyUI with Automatic1111.")
    expect(understood).to_have_count(2, timeout=LIVE_TIMEOUT_MS)
    expect(understood.last).to_have_attribute("data-relation", "change_within_session")
    expect(understood.last).to_contain_text("New phase within the session — phase goal:")
    expect(orchestration.last).to_contain_text("Orchestration (reconcile) found nothing to add")
    wait_idle(page)
    expect(page.get_by_test_id("session-goal").get_by_test_id("goal-value")).to_have_text(RESEARCH_TASK)
    expect(page.get_by_test_id("phase-goal").get_by_test_id("goal-value")).to_have_text(
        "Now compare ComfyUI with Automatic1111."
    )


def test_the_phase_goal_is_edited_in_place_and_persists(page, tmp_path):
    log_in(page)
    _, sub = new_sub_session(page, "Goals")
    open_session(page, sub["id"])
    send(page, RESEARCH_TASK)
    expect(assistant_messages(page).last).to_contain_text(RESEARCH_ANSWER, timeout=LIVE_TIMEOUT_MS)
    wait_idle(page)

    other = page.context.new_page()  # a second tab on the same Session follows live
    open_session(other, sub["id"])

    phase = page.get_by_test_id("phase-goal")
    phase.get_by_role("button", name="Edit the phase goal").click()
    editor = page.get_by_label("Phase goal", exact=True)
    expect(editor).to_be_focused()
    expect(editor).to_have_value(RESEARCH_TASK)

    # Too long: the API's 400 is told inline, the editor stays open, nothing changed.
    editor.fill("x" * 10001)
    phase.get_by_test_id("goal-save").click()
    error = phase.get_by_test_id("goal-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("no more than 10000 characters")
    expect(editor).to_have_attribute("aria-invalid", "true")
    page.screenshot(path=str(tmp_path / "goal-error.png"))
    assert page.request.get(f"/api/v1/sessions/{sub['id']}/").json()["phase_goal"] == RESEARCH_TASK

    # Cancel (Esc) keeps the old goal.
    editor.press("Escape")
    expect(phase.get_by_test_id("goal-editor")).to_be_hidden()
    expect(phase.get_by_test_id("goal-value")).to_have_text(RESEARCH_TASK)

    new_goal = "Compare the three most used ComfyUI node packs"
    phase.get_by_role("button", name="Edit the phase goal").click()
    expect(error).to_be_hidden()
    editor.fill(new_goal)
    phase.get_by_test_id("goal-save").click()
    expect(phase.get_by_test_id("goal-editor")).to_be_hidden()
    expect(phase.get_by_test_id("goal-value")).to_have_text(new_goal)
    note = page.get_by_test_id("goals-updated")
    expect(note).to_have_count(1)
    expect(note).to_contain_text("Goals edited by you")
    expect(note).to_contain_text(f"Phase goal: “{new_goal}”")

    expect(other.get_by_test_id("phase-goal").get_by_test_id("goal-value")).to_have_text(new_goal)
    expect(other.get_by_test_id("goals-updated")).to_have_count(1)

    session = page.request.get(f"/api/v1/sessions/{sub['id']}/").json()
    assert (session["phase_goal"], session["session_goal"]) == (new_goal, RESEARCH_TASK)
    page.reload()
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
    expect(phase.get_by_test_id("goal-value")).to_have_text(new_goal)
    expect(page.get_by_test_id("session-goal").get_by_test_id("goal-value")).to_have_text(RESEARCH_TASK)
    expect(note).to_have_count(1)
    other.close()


def test_a_malformed_understanding_is_a_warning_and_the_turn_runs(page, tmp_path):
    log_in(page)
    _, sub = new_sub_session(page, "Malformed")
    open_session(page, sub["id"])
    send(page, MALFORMED_TASK)
    warning = page.get_by_test_id("preparation-failed")
    expect(warning).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(warning).to_have_attribute("data-code", "task_relation_failed")
    expect(warning).to_contain_text("Task understanding failed — the turn ran anyway")
    expect(assistant_messages(page).last).to_contain_text(RESEARCH_ANSWER, timeout=LIVE_TIMEOUT_MS)
    wait_idle(page)
    expect(page.get_by_test_id("task-understood")).to_have_count(0)
    expect(page.locator("#composer-note")).not_to_have_class(re.compile(r"\berror\b"))
    items = timeline(page)
    assert (
        items.index("message:user") < items.index("preparation-failed") < items.index("message:assistant")
    ), items
    warning.get_by_text("What went wrong").click()
    expect(warning).to_contain_text("not JSON")
    warning.screenshot(path=str(tmp_path / "preparation-failed.png"))

    page.reload()
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
    expect(warning).to_have_count(1)
    expect(warning).to_contain_text("the turn ran anyway")


def test_a_main_session_lists_its_sub_session_and_shows_the_result_as_a_notice(page, tmp_path):
    log_in(page)
    main = create_session(page, title="Coordinator")
    open_session(page, main["id"])
    children = page.get_by_test_id("children")
    expect(children).to_be_hidden()

    send(page, DELEGATE_TASK)
    expect(assistant_messages(page).filter(has_text=DELEGATED)).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    delegate_card = page.locator("[data-testid=tool-card][data-tool=session_delegate]")
    expect(delegate_card).to_have_attribute("data-ok", "true")
    child = children.get_by_test_id("child-session")
    expect(child).to_have_count(1)
    expect(child.get_by_test_id("child-link")).to_have_text(CHILD_TITLE)
    expect(child.locator(".status-badge")).to_be_visible()

    # The sub-Session's result comes back as a session event: a notice, not the user's bubble.
    notice = page.get_by_test_id("session-event")
    expect(notice).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(assistant_messages(page).filter(has_text=AFTER_EVENT)).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(
        page.locator("[data-testid=message][data-role=user]:not([data-kind=session_event]) .message-body")
    ).to_have_text([DELEGATE_TASK])
    child_id = child.get_attribute("data-id")
    link = notice.get_by_test_id("session-event-link")
    expect(link).to_have_attribute("href", f"/sessions/{child_id}/")
    expect(link).to_have_text(CHILD_TITLE)
    expect(notice).to_contain_text(CHILD_ANSWER)
    expect(notice).not_to_contain_text("[Session event")
    expect(notice.locator(".status-badge")).to_have_attribute("data-status", "idle")
    expect(notice.get_by_role("button", name=f"from-{child_id[:8]}/guide.md")).to_be_visible()
    expect(child).to_have_attribute("data-status", "idle")
    wait_idle(page)
    notice.scroll_into_view_if_needed()
    page.screenshot(path=str(tmp_path / "main-with-child.png"), full_page=True)

    # The child links back to its MainSession.
    child.get_by_test_id("child-link").click()
    expect(page).to_have_url(re.compile(rf"/sessions/{child_id}/$"))
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
    expect(page.get_by_test_id("session-parent")).to_contain_text("sub-Session of Coordinator")
    handed_over = page.locator("[data-testid=message][data-role=user]").get_by_test_id("handed-over")
    expect(handed_over).to_have_text(["Handed over by the MainSession"])
    expect(handed_over.get_by_role("link")).to_have_attribute("href", f"/sessions/{main['id']}/")
    expect(page.get_by_test_id("task-understood")).to_have_count(1)
    page.get_by_test_id("parent-link").click()
    expect(page).to_have_url(re.compile(rf"/sessions/{main['id']}/$"))
    expect(page.get_by_test_id("children").get_by_test_id("child-link")).to_have_text([CHILD_TITLE])
    expect(page.get_by_test_id("session-event")).to_have_count(1)

    # The home page marks the sub-Session.
    page.goto("/")
    row = page.get_by_test_id("session-row").filter(has_text=CHILD_TITLE)
    expect(row.get_by_test_id("sub-badge")).to_have_text("sub")
    expect(
        page.get_by_test_id("session-row").filter(has_text="Coordinator").first.get_by_test_id("sub-badge")
    ).to_have_count(0)


def test_direction_overrides_in_arguments_are_shown_by_name_where_a_person_judges_them(page):
    """A model naming `keep/\u202etxt.exe` must not show the approver `keep/exe.txt`."""
    log_in(page)
    main = create_session(page, title="Spoof check")
    open_session(page, main["id"])
    send(page, SPOOF_TASK)
    chip = page.get_by_test_id("approval-paths").locator("code")
    expect(chip).to_have_text("keep/⟨U+202E⟩txt.exe", timeout=LIVE_TIMEOUT_MS)
    card = page.locator("[data-testid=tool-card][data-tool=fs_delete_files]")
    expect(card.locator(".tool-args")).to_contain_text("⟨U+202E⟩")
    assert "\u202e" not in card.locator(".tool-args").inner_text()
