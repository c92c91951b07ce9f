"""Skills and long-term Memory in the browser workspace, in Chromium against the real `runstack`
(SQLite, in-process worker); the model is the scripted server on loopback, the demo tenant's
default model configuration. The demo tenant has the `research-guide` Skill (seed_demo imports
it), the demo user three memories and bob (a member of the same tenant) one of his own.

- the Memories page lists only the signed-in user's memories, filters them and deletes one;
- a Session whose model calls `skills_load` shows the skill in the Capabilities card and a note
  in the timeline, live and after a reload, exactly once;
- a later Session of the same user shows "Recalled N memories", unfolding to their texts (a
  memory deleted since shows as deleted).
"""

import re
import sqlite3
from types import SimpleNamespace

import pytest

from tests.support.model_server import ScriptedModelServer, json_reply, text_reply, tool_call, tool_reply

from ..integration.processes import served_embedded
from .conftest import watched_page
from .test_workspace import LIVE_TIMEOUT_MS, SESSION_URL, assistant_messages, expect, log_in

PREFERENCE = "Weekly reports go in Markdown tables, never in PDF."
DECISION = "The support KPI report covers the last seven days."
ENTITY = "Dana Reyes leads the support team."
BOBS = "Bob wants every report as a PDF attachment."
LOAD_TASK = "Research ComfyUI with the research guide."
LOADED_ANSWER = "The research guide is loaded; here is the plan."
REPORT_TASK = "Write the support KPI report for the last seven days."

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

users = get_user_model().objects
demo, bob = users.get(username="demo"), users.get(username="bob")
for user, text, kind in [
    (bob, {bobs!r}, "preference"),
    (demo, {entity!r}, "entity"),
    (demo, {decision!r}, "decision"),
    (demo, {preference!r}, "preference"),
]:
    memory.save(tenant_id=tenant.pk, user_id=user.pk, text=text, kind=kind)
"""


def agent(request):
    """Loads the research guide when asked to research, then answers; a line for anything else."""
    messages = request.messages
    if any(m["role"] == "tool" and m.get("tool_call_id") == "load" for m in messages):
        return text_reply(LOADED_ANSWER)
    if any(m["role"] == "user" and LOAD_TASK in str(m["content"]) for m in messages):
        return tool_reply(tool_call("skills_load", {"skills": ["research-guide"]}, id="load"))
    return text_reply("Here is the report.")


@pytest.fixture(scope="module")
def model_server():
    with ScriptedModelServer() as server:
        server.default("agent", agent)
        server.default(
            "task_relation",
            json_reply(
                {
                    "task_relation": "new_task",
                    "skill_recall_terms": [],
                    "tool_recall_terms": [],
                    "memory_recall_terms": [],
                }
            ),
        )
        server.default("orchestrate", json_reply({"skills": [], "toolsets": [], "tools": []}))
        yield server


@pytest.fixture(scope="module")
def stack(tmp_path_factory, model_server):
    root = tmp_path_factory.mktemp("memory-stack")
    setup = SETUP.format(
        base_url=model_server.base_url, bobs=BOBS, entity=ENTITY, decision=DECISION, preference=PREFERENCE
    )
    with served_embedded(
        root,
        ("seed_demo",),
        ("create_user", "bob", "--tenant", "demo", "--password", "bob-password-1"),
        ("shell", "-c", setup),
    ) as served:
        yield SimpleNamespace(**vars(served), db=root / "db.sqlite3")


def memory_ids(stack, text) -> list[int]:
    with sqlite3.connect(stack.db) as db:
        return [row[0] for row in db.execute("SELECT id FROM sessions_app_memory WHERE text = ?", (text,))]


def new_session(page, title, task):
    page.goto("/")
    page.get_by_test_id("new-session-title").fill(title)
    page.get_by_test_id("new-session-goal").fill(task)
    page.get_by_test_id("new-session-submit").click()
    expect(page).to_have_url(SESSION_URL)
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")


def timeline(page) -> list[str]:
    """The conversation's items in order: messages by role, notes and cards by test id."""
    return page.eval_on_selector_all(
        "#messages > li",
        "items => items.map(li => li.dataset.testid === 'message' ? `message:${li.dataset.role}`"
        " : li.dataset.skills ? `${li.dataset.testid}:${li.dataset.skills}` : li.dataset.testid)",
    )


def test_the_memories_page_lists_filters_and_deletes_only_the_users_own(page, stack, tmp_path):
    log_in(page)
    page.get_by_test_id("nav-memories").click()
    expect(page).to_have_url(re.compile(r"/memories/$"))
    rows = page.get_by_test_id("memory-row")
    texts = page.get_by_test_id("memory-text")
    expect(texts).to_have_text([PREFERENCE, DECISION, ENTITY])  # newest first; never bob's
    expect(page.locator("#memory-list")).not_to_contain_text("Bob")
    expect(rows.first.get_by_test_id("memory-kind-badge")).to_have_text("Preference")
    expect(page.get_by_test_id("memories-state")).to_have_text("3 memories.")
    page.screenshot(path=str(tmp_path / "memories-page.png"), full_page=True)

    page.get_by_label("Kind").select_option("decision")
    expect(texts).to_have_text([DECISION])
    page.get_by_label("Kind").select_option("topic")
    expect(rows).to_have_count(0)
    expect(page.get_by_test_id("memories-state")).to_have_text("No memories match these filters.")
    expect(page.get_by_test_id("memories-empty")).to_be_hidden()
    page.get_by_label("Kind").select_option("")
    page.get_by_label("Search").fill("dana support")
    expect(texts).to_have_text([ENTITY])

    # Delete asks once more; Cancel keeps it, confirming deletes the row for good.
    row = rows.filter(has_text=ENTITY)
    row.get_by_test_id("memory-delete").click()
    expect(row).to_contain_text("Delete this memory for good?")
    row.get_by_test_id("memory-delete-cancel").click()
    expect(row.get_by_test_id("memory-delete")).to_be_visible()
    assert memory_ids(stack, ENTITY)
    row.get_by_test_id("memory-delete").click()
    row.get_by_test_id("memory-delete-confirm").click()
    expect(rows).to_have_count(0)
    expect(page.get_by_test_id("memories-state")).to_have_text(
        "Memory deleted. No memories match these filters."
    )
    assert memory_ids(stack, ENTITY) == []

    page.get_by_label("Search").fill("")
    expect(texts).to_have_text([PREFERENCE, DECISION])
    page.reload()
    expect(texts).to_have_text([PREFERENCE, DECISION])


def test_a_loaded_skill_shows_in_the_capabilities_card_and_the_timeline(page, stack, tmp_path):
    log_in(page)
    new_session(page, "Research", LOAD_TASK)
    card = page.get_by_test_id("capabilities")
    skills = card.locator("[data-testid=capability][data-kind=skills]")
    # The demo tenant's seeded policy attaches a tool set when the Session is made; the skill
    # comes later, from the model's `skills_load`.
    note = page.locator("[data-testid=capabilities-note][data-skills=research-guide]")

    expect(assistant_messages(page).last).to_contain_text(LOADED_ANSWER, timeout=LIVE_TIMEOUT_MS)
    expect(skills.locator(".capability-name")).to_have_text(["research-guide"])
    expect(skills.get_by_test_id("capability-description")).not_to_be_empty()  # from /api/v1/skills/
    expect(card.get_by_test_id("capabilities-empty")).to_be_hidden()
    expect(note).to_have_count(1)
    expect(note.locator(".turn-note-lines")).to_have_text("Loaded skill research-guide")
    expect(page.get_by_test_id("session-status")).to_have_attribute(
        "data-status", "idle", timeout=LIVE_TIMEOUT_MS
    )
    toolsets = card.locator("[data-testid=capability][data-kind=toolsets]")
    expect(toolsets.locator(".capability-name")).to_have_text(["workspace-cleanup"])
    expect(toolsets.get_by_test_id("capability-source")).to_have_text(["default"])
    expect(skills.get_by_test_id("capability-source")).to_have_text(["loaded by the agent"])
    expect(page.locator("#event-log .event[data-type='capabilities.added'] .event-detail")).to_have_text(
        ["tool set workspace-cleanup", "skill research-guide"]
    )

    def in_place():
        # The recall follows the request; the skill note follows the step that loaded it.
        items = timeline(page)
        loaded_note = "capabilities-note:research-guide"
        assert items.count(loaded_note) == 1 and items.count("memory-recalled") == 1, items
        assert items[:2] == ["capabilities-note", "message:user"], items  # the tool set: before any message
        first_user, recalled = items.index("message:user"), items.index("memory-recalled")
        loaded = items.index(loaded_note)
        assert recalled == first_user + 1, items
        assert items[loaded - 1] == "message:assistant" and "message:assistant" in items[loaded + 1 :], items
        loader = assistant_messages(page).first
        expect(loader.locator("[data-testid=tool-card][data-tool=skills_load]")).to_have_count(1)

    in_place()
    page.screenshot(path=str(tmp_path / "skill-live.png"), full_page=True)

    page.reload()
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
    expect(assistant_messages(page).last).to_contain_text(LOADED_ANSWER)
    expect(skills.locator(".capability-name")).to_have_text(["research-guide"])
    expect(note).to_have_count(1)
    expect(note.locator(".turn-note-lines")).to_have_text("Loaded skill research-guide")
    in_place()


def test_a_later_session_shows_the_recalled_memories_and_one_deleted_since(page, stack, tmp_path):
    log_in(page)
    new_session(page, "Weekly KPI report", REPORT_TASK)
    expect(assistant_messages(page).last).to_contain_text("Here is the report.", timeout=LIVE_TIMEOUT_MS)
    note = page.get_by_test_id("memory-recalled")
    expect(note).to_have_count(1)
    expect(note).to_contain_text("Recalled 2 memories")
    # No skill was loaded here (the seeded tool set only).
    card = page.get_by_test_id("capabilities")
    expect(card.locator("[data-testid=capability] .capability-name")).to_have_text(["workspace-cleanup"])
    recalled = note.get_by_test_id("recalled-memory")
    expect(recalled).to_have_count(0)  # read only when unfolded
    note.get_by_test_id("memory-recalled-summary").click()
    expect(recalled).to_have_count(2)
    expect(note.get_by_test_id("recalled-memories")).to_contain_text(PREFERENCE)
    expect(note.get_by_test_id("recalled-memories")).to_contain_text(DECISION)
    expect(note.locator("[data-testid=recalled-memory][data-state=ok]")).to_have_count(2)
    expect(page.locator("#event-log .event[data-type='memory.recalled'] .event-detail")).to_contain_text(
        ["2 memories"]
    )
    note.screenshot(path=str(tmp_path / "recalled-note.png"))

    # Deleted since (on the Memories page): the note still counts it, and says it is gone.
    session_url = page.url
    page.get_by_test_id("nav-memories").click()
    row = page.get_by_test_id("memory-row").filter(has_text=DECISION)
    row.get_by_test_id("memory-delete").click()
    row.get_by_test_id("memory-delete-confirm").click()
    expect(row).to_have_count(0)
    page.goto(session_url)
    expect(note).to_have_count(1)
    note.get_by_test_id("memory-recalled-summary").click()
    expect(note.locator("[data-testid=recalled-memory][data-state=deleted]")).to_have_text(["(deleted)"])
    expect(note.locator("[data-testid=recalled-memory][data-state=ok]")).to_contain_text(PREFERENCE)


def test_a_colleague_sees_who_wrote_and_that_memories_were_recalled_but_not_what_they_say(
    page, browser, stack
):
    """A Session is the tenant's; the owner's memories are not. bob (a member) opens demo's
    Session: demo's message is labelled "demo", not "You", and the recall note names whose
    memories they were without unfolding to them."""
    log_in(page)
    new_session(page, "Shared report", REPORT_TASK)
    expect(assistant_messages(page).last).to_contain_text("Here is the report.", timeout=LIVE_TIMEOUT_MS)
    expect(page.locator("[data-testid=message][data-role=user] .message-author")).to_have_text(["You"])
    url = page.url

    with watched_page(browser, stack.base, stack.log) as colleague:
        log_in(colleague, "bob", "bob-password-1")
        colleague.goto(url)
        expect(colleague.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
        expect(colleague.locator("[data-testid=message][data-role=user] .message-author")).to_have_text(
            ["demo"]
        )
        note = colleague.get_by_test_id("memory-recalled")
        expect(note).to_have_count(1)
        # (The test before deleted one of demo's memories: one or two are left to recall.)
        expect(note).to_have_text(
            re.compile(r"Recalled [12] of demo's memories for this task \(private to them\)")
        )
        expect(note.locator("details")).to_have_count(0)
        expect(colleague.locator("#messages")).not_to_contain_text(PREFERENCE)
