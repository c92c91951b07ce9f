"""The goal driver on the Session page, in Chromium against the real `runstack` (SQLite,
in-process worker); the model is the scripted server on loopback, the demo tenant's default model
configuration.

- the Goal run card starts a run from its form (a bad value is told inline, at its field), follows
  it live to "Round 2 of 3" and to the stop at the round limit with its reason; the timeline says
  what the driver did, a round's message is labelled as the driver's; all of it again after a
  reload, and at phone width without sideways scrolling;
- a run paused by a recovery (the driver's own `pause_after_recovery`, run against the stack's
  database while round 1 is with the model) shows the warning and Resume, and Resume goes on.
"""

import re
import threading
from types import SimpleNamespace

import pytest

from tests.support.model_server import ScriptedModelServer, text_reply, tool_call, tool_reply

from ..integration.processes import embedded_env, manage, served_embedded
from .test_outer_loop_ui import create_session, open_session, timeline, wait_idle
from .test_workspace import LIVE_TIMEOUT_MS, expect, log_in

GOAL = "Write report.md: a short report on the Q3 tickets, with a summary and a table."
# Markup in a goal is text wherever it is shown (the card, the notes, the round's message).
PAUSED_GOAL = "Write faq.md: the <b>ten</b> questions asked most <img src=x onerror=window.__pwned=1>."
ROUND_DELAY_S = 2.0  # rounds after the first take this long: the card is seen in between
ROUND_HEAD = re.compile(r"^Goal run, round (\d+) of (\d+)\.")
PLAN = {"title": "Report", "tasks": ["draft", "check"]}

SETUP = """
from sessions_app.models import ModelConfig
from tenancy_app.models import Tenant

ModelConfig.objects.update_or_create(
    tenant=Tenant.objects.get(slug="demo"), name="scripted",
    defaults=dict(base_url="{base_url}", model="scripted-model", is_default=True, configured_by_operator=True),
)
"""

# What `engine.recover_lost_runner` does to a goal run when it takes over from a lost runner.
PAUSE = """
from sessions_app.runtime import engine, goal_driver

with engine.locked_session("{session_id}") as session:
    assert goal_driver.pause_after_recovery(session) is not None
"""


class PausedRound:
    """Holds round 1 of the paused test's run with the model until the test lets it go."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()


def agent(held: PausedRound):
    """Round 1 makes a plan and leaves both tasks open, so the driver goes on; later rounds only
    talk (slowly). Round 1 of PAUSED_GOAL waits for `held.release`."""

    def reply(request):
        users = [m for m in request.messages if m["role"] == "user"]
        text = str(users[-1]["content"]) if users else ""
        head = ROUND_HEAD.match(text)
        if not head:
            return text_reply("Noted.")
        number = int(head.group(1))
        if request.messages[-1]["role"] == "tool":
            return text_reply(f"Round {number}: drafted the outline; the check comes next.")
        if number == 1:
            if PAUSED_GOAL in text:
                held.entered.set()
                held.release.wait(60)
            return tool_reply(tool_call("plan_create", PLAN, id="plan"))
        return text_reply(f"Round {number}: still drafting.", delay_before_s=ROUND_DELAY_S)

    return reply


@pytest.fixture(scope="module")
def held():
    return PausedRound()


@pytest.fixture(scope="module")
def model_server(held):
    with ScriptedModelServer() as server:
        server.default("agent", agent(held))
        yield server
    held.release.set()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, model_server):
    root = tmp_path_factory.mktemp("goal-run-stack")
    with served_embedded(
        root, ("seed_demo",), ("shell", "-c", SETUP.format(base_url=model_server.base_url))
    ) as served:
        yield SimpleNamespace(**vars(served), env=embedded_env(root))


def card(page):
    return page.get_by_test_id("goal-run")


def wait_for_status(page, status):
    expect(card(page)).to_have_attribute("data-status", status, timeout=LIVE_TIMEOUT_MS)


def goal_notes(page) -> list[str]:
    """The timeline's goal-run notes and round labels, in order, as their text."""
    return page.eval_on_selector_all(
        "#messages > li",
        "items => items.filter(li => (li.dataset.testid || '').startsWith('goal-') || li.dataset.kind === 'goal_round')"
        ".map(li => (li.dataset.kind === 'goal_round' ? li.querySelector('[data-testid=goal-round-label]') : li)"
        ".innerText.replace(/\\s+/g, ' ').trim())",
    )


STARTED = f"Goal run started by you: up to 3 rounds, 200 000 tokens, 1 h — “{GOAL}”"
FINISHED_NOTES = [
    f"◎ {STARTED} It is now the session goal and the phase goal.",
    "GOAL RUN · ROUND 1 OF 3",
    "↻ Round 1 of 3 done — continuing: the agent has not said the goal is complete; the records show 2 open plan tasks",
    "GOAL RUN · ROUND 2 OF 3",
    "↻ Round 2 of 3 done — continuing: the agent has not said the goal is complete; the records show 2 open plan tasks",
    "GOAL RUN · ROUND 3 OF 3",
    "■ Goal run stopped after round 3: round limit reached (3 rounds), the agent never said the goal was complete",
]


def assert_finished_run_shown(page):
    run = card(page)
    expect(run.get_by_test_id("goal-run-status")).to_have_text("stopped")
    expect(run.get_by_test_id("goal-run-goal")).to_have_text(f"“{GOAL}”")
    expect(run.get_by_test_id("goal-run-round")).to_have_text("Stopped after round 3 of 3")
    expect(run.get_by_test_id("goal-run-decision")).to_have_attribute("data-decision", "stop")
    expect(run.get_by_test_id("goal-run-decision")).to_contain_text(
        "Goal run stopped after round 3: round limit reached (3 rounds)"
    )
    expect(run.get_by_test_id("goal-run-tokens")).to_contain_text(
        re.compile(r"Tokens\s*\d[\d\s]* of 200\s000")
    )
    expect(run.get_by_test_id("goal-run-time")).to_contain_text(re.compile(r"Time\s*\d.* of 1 h"))
    expect(run.get_by_role("button", name="Start a new goal run")).to_be_visible()
    expect(run.get_by_test_id("goal-run-stop")).to_have_count(0)

    assert goal_notes(page) == FINISHED_NOTES, goal_notes(page)
    # A round is the driver's, queued in the starter's name: never a bubble from "You".
    expect(page.locator("[data-testid=message][data-role=user]:not([data-kind=goal_round])")).to_have_count(0)
    rounds = page.get_by_test_id("goal-round")
    expect(rounds).to_have_count(3)
    expect(rounds.first).to_contain_text("queued for you by the goal driver")
    expect(rounds.first).to_contain_text(f"Goal: “{GOAL}”")
    expect(rounds.nth(1).get_by_test_id("goal-round-facts").get_by_role("listitem")).to_have_text(
        ["open plan task t1 (pending): draft", "open plan task t2 (pending): check"]
    )
    # The records first, then the agent's claim they were weighed against (here: none made).
    expect(rounds.nth(1).get_by_test_id("goal-round-claim")).to_have_text(
        "The agent did not say the goal is complete (update_goal)."
    )
    items = timeline(page)
    # Each decision follows its round's answer and delivery card, before the next round.
    for at, item in enumerate(items):
        if item == "goal-decided" and at + 1 < len(items):
            assert items[at - 1] == "delivery-card" and items[at + 1] == "message:goal_round", items
    assert items.index("goal-started") < items.index("message:goal_round"), items


def test_a_goal_run_starts_from_the_card_and_is_followed_live_to_its_stop(page, tmp_path):
    log_in(page)
    session = create_session(page, title="Q3 report")
    open_session(page, session["id"])
    run = card(page)
    expect(run).to_have_attribute("data-status", "none")
    expect(run.get_by_test_id("goal-run-lead")).to_be_visible()
    run.get_by_role("button", name="Run as a goal…").click()
    goal = run.get_by_label("Goal", exact=True)
    expect(goal).to_be_focused()
    expect(goal).to_have_value("")
    expect(run.get_by_label("Rounds")).to_have_value("3")
    expect(run.get_by_label("Token budget")).to_have_value("200000")
    expect(run.get_by_label("Time budget")).to_have_value("1:00")

    # A time budget the card cannot read is told at its field, before anything is sent.
    goal.fill(GOAL)
    run.get_by_label("Time budget").fill("25:00")
    run.get_by_role("button", name="Start the goal run").click()
    time_error = run.locator("#goal-run-wall_clock-error")
    expect(time_error).to_have_text("At most 24:00 (24 hours).")
    expect(run.get_by_label("Time budget")).to_have_attribute("aria-invalid", "true")
    # A value the API refuses: its 400 details, at the field.
    run.get_by_label("Time budget").fill("1:00")
    run.get_by_label("Token budget").fill("0")
    run.get_by_role("button", name="Start the goal run").click()
    token_error = run.locator("#goal-run-token_budget-error")
    expect(token_error).to_have_text("Ensure this value is greater than or equal to 1.")
    expect(run.get_by_label("Token budget")).to_have_attribute("aria-invalid", "true")
    expect(run.get_by_label("Token budget")).to_be_focused()
    expect(time_error).to_be_hidden()
    run.screenshot(path=str(tmp_path / "goal-run-form-error.png"))
    assert page.request.get(f"/api/v1/sessions/{session['id']}/goal-run/").status == 404

    run.get_by_label("Token budget").fill("200 000")
    run.get_by_role("button", name="Start the goal run").click()
    expect(run.get_by_test_id("goal-run-form")).to_be_hidden()
    expect(run.get_by_test_id("goal-run-status")).to_have_text("active")
    expect(run.get_by_test_id("goal-run-round")).to_have_text("Round 2 of 3", timeout=LIVE_TIMEOUT_MS)
    expect(run.get_by_test_id("goal-run-decision")).to_contain_text(
        "Round 1 of 3 done — continuing: the agent has not said the goal is complete; the records show 2 open plan tasks"
    )
    expect(run.get_by_role("button", name="Stop…")).to_be_visible()
    page.screenshot(path=str(tmp_path / "goal-run-round-2.png"))

    wait_for_status(page, "stopped")
    wait_idle(page)
    assert_finished_run_shown(page)
    expect(page.get_by_test_id("phase-goal").get_by_test_id("goal-value")).to_have_text(GOAL)
    shown = page.request.get(f"/api/v1/sessions/{session['id']}/goal-run/").json()
    assert (shown["status"], shown["rounds_done"], shown["token_budget"]) == ("stopped", 3, 200_000)
    page.screenshot(path=str(tmp_path / "goal-run-stopped.png"), full_page=True)

    page.reload()
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
    assert_finished_run_shown(page)

    # A phone: the card and the notes wrap, nothing scrolls sideways.
    page.set_viewport_size({"width": 390, "height": 844})
    expect(run.get_by_test_id("goal-run-round")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    run.scroll_into_view_if_needed()
    page.screenshot(path=str(tmp_path / "goal-run-phone.png"), full_page=True)

    # Finished: a new run starts from the same card.
    run.get_by_role("button", name="Start a new goal run").click()
    expect(run.get_by_label("Goal", exact=True)).to_be_focused()
    run.get_by_role("button", name="Cancel").click()
    expect(run.get_by_test_id("goal-run-form")).to_be_hidden()


def test_a_run_paused_by_a_recovery_waits_for_resume_and_then_goes_on(page, stack, held, tmp_path):
    log_in(page)
    session = create_session(page, title="Q3 FAQ")
    open_session(page, session["id"])
    started = page.request.post(
        f"/api/v1/sessions/{session['id']}/goal-run/",
        data={"goal": PAUSED_GOAL, "max_rounds": 2},
        headers={"X-CSRFToken": next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")},
    )
    assert started.status == 201, started.text()
    run = card(page)
    expect(run.get_by_test_id("goal-run-round")).to_have_text("Round 1 of 2")
    expect(run.get_by_test_id("goal-run-goal")).to_have_text(f"“{PAUSED_GOAL}”")

    # Round 1 is with the model when a runner takes over from a lost one: the run pauses.
    assert held.entered.wait(LIVE_TIMEOUT_MS / 1000)
    manage(stack.env, "shell", "-c", PAUSE.format(session_id=session["id"]))
    held.release.set()

    # The round that was running ends normally and is counted; nothing else runs by itself.
    wait_for_status(page, "paused")
    expect(run.get_by_test_id("goal-run-round")).to_have_text(
        "Paused after round 1 of 2", timeout=LIVE_TIMEOUT_MS
    )
    paused = run.get_by_test_id("goal-run-paused")
    expect(paused).to_contain_text("Paused: a runner was lost (recovery); resume it to continue.")
    expect(run.get_by_test_id("goal-run-decision")).to_have_count(0)
    note = page.get_by_test_id("goal-paused")
    expect(note).to_have_count(1)
    expect(note).to_contain_text("Goal run paused: a runner was lost (recovery); resume it to continue.")
    expect(note).to_contain_text("Resume (or Stop) is in the Goal run card")
    wait_idle(page)
    expect(run.get_by_test_id("goal-run-status")).to_have_text("paused")
    run.screenshot(path=str(tmp_path / "goal-run-paused.png"))
    note.screenshot(path=str(tmp_path / "goal-paused-note.png"))

    page.reload()
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-state", "live")
    expect(note).to_have_count(1)
    expect(run.get_by_test_id("goal-run-status")).to_have_text("paused")
    assert page.request.get(f"/api/v1/sessions/{session['id']}/goal-run/").json()["status"] == "paused"

    # Stop asks first; "Cancel" keeps the run as it was.
    run.get_by_role("button", name="Stop…").click()
    expect(run.get_by_text("Stop this goal run?")).to_be_visible()
    run.get_by_role("button", name="Cancel").click()
    expect(run.get_by_role("button", name="Stop…")).to_be_focused()

    paused.get_by_role("button", name="Resume").click()
    resumed = page.get_by_test_id("goal-resumed")
    expect(resumed).to_contain_text("Goal run resumed by you")
    wait_for_status(page, "stopped")
    expect(run.get_by_test_id("goal-run-round")).to_have_text("Stopped after round 2 of 2")
    expect(run.get_by_test_id("goal-run-decision")).to_contain_text(
        "Goal run stopped after round 2: round limit reached (2 rounds)"
    )
    expect(run.get_by_test_id("goal-run-paused")).to_have_count(0)
    expect(page.get_by_test_id("goal-round")).to_have_count(2)
    items = timeline(page)
    assert items.index("goal-paused") < items.index("goal-resumed") < items.index("goal-decided"), items
    assert items.count("goal-decided") == 2, items
    expect(page.get_by_test_id("goal-started")).to_contain_text(PAUSED_GOAL)
    expect(page.get_by_test_id("goal-round").first).to_contain_text(f"Goal: “{PAUSED_GOAL}”")
    assert page.locator("#session-app b, #session-app img").count() == 0
    assert page.evaluate("window.__pwned") is None
