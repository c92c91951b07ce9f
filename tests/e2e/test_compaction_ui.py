"""A long turn that outgrows a small context window, watched in Chromium: the status badge
shows `compressing` while the context is compacted, the timeline tells what happened (live and
after a reload), and the turn goes on to its answer. The real `runstack` (daphne + in-process
worker, SQLite); the model is the scripted server on loopback, reached through a model
configuration of the demo tenant with a 6,000-token window."""

import pytest

from tests.support.model_server import ScriptedModelServer, json_reply, text_reply, tool_call, tool_reply

from ..integration.processes import served_embedded
from .test_workspace import LIVE_TIMEOUT_MS, assistant_messages, expect, log_in

STEPS = 14
TASK = "Write the chapters."
STATE = {
    "goal": "write the chapters",
    "deliverables": ["chapter files"],
    "progress": ["wrote the first chapters"],
    "decisions": [],
    "constraints": [],
    "open_questions": [],
    "next_actions": ["write the remaining chapters"],
    "artifacts": [],
    "active_user_request": "Write the chapters.",
}


@pytest.fixture(scope="module")
def model_server():
    """Answers the chapters task step by step (counting its own answers: the request is
    compacted, so it cannot count from history); any other Session (the seeded demo) gets a line."""
    answered = {"steps": 0}

    def agent(request):
        if not any(m["role"] == "user" and m["content"] == TASK for m in request.messages):
            return text_reply("This model only writes chapters.")
        step = answered["steps"]
        answered["steps"] += 1
        if step >= STEPS:
            return text_reply("All chapters are written.")
        content = f"# Chapter {step}\n" + "words " * 250
        return tool_reply(tool_call("fs_write", {"path": f"chapter_{step:02}.md", "content": content}))

    with ScriptedModelServer() as server:
        server.default("agent", agent)
        server.default("summary", json_reply(STATE))
        yield server


@pytest.fixture(scope="module")
def stack(tmp_path_factory, model_server):
    small_model = f"""
from sessions_app.models import ModelConfig
from tenancy_app.models import Tenant
ModelConfig.objects.update_or_create(
    tenant=Tenant.objects.get(slug="demo"), name="small-window",
    defaults=dict(base_url="{model_server.base_url}", model="scripted-model", context_window=6000,
                  max_output_tokens=1000, is_default=True, configured_by_operator=True),
)
"""
    root = tmp_path_factory.mktemp("compaction-stack")
    with served_embedded(root, ("seed_demo",), ("shell", "-c", small_model)) as served:
        yield served


def test_a_compaction_is_shown_live_and_after_a_reload(browser, stack, model_server):
    context = browser.new_context(base_url=stack.base, viewport={"width": 1360, "height": 900})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        log_in(page)
        page.get_by_test_id("new-session-title").fill("Chapters")
        page.get_by_test_id("new-session-submit").click()
        expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
        page.get_by_test_id("composer-input").fill(TASK)
        page.get_by_test_id("send-button").click()

        expect(assistant_messages(page).last).to_contain_text(
            "All chapters are written.", timeout=LIVE_TIMEOUT_MS
        )
        notes = page.get_by_test_id("compaction-note")
        expect(notes.first).to_contain_text("Context compacted")
        assert notes.count() == len(model_server.requests_for("summary")) >= 1
        # The status went through `compressing` (the activity log lists every status event; the
        # badge may pass through it within one frame).
        compressing = page.locator(
            "li.event[data-type='session.status'] .event-detail", has_text="compressing"
        )
        assert compressing.count() == notes.count()
        expect(page.get_by_test_id("session-status")).to_have_attribute("data-status", "idle")

        # Counted before the reload: `notes.count()` afterwards would count a page still loading.
        shown_live = notes.count()
        page.reload()
        expect(assistant_messages(page).last).to_contain_text("All chapters are written.")
        expect(page.get_by_test_id("compaction-note")).to_have_count(shown_live)
    finally:
        context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"
