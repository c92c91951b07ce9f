"""An MCP server's question (elicitation) on the Session page, in Chromium against the real
`runstack` (SQLite, in-process worker); the example MCP server is a real stdio process; the model
is the scripted server on loopback.

- the input request card appears live with the server's question (a direction override in it is
  shown by name, not obeyed) and the fields rendered from the schema: required markers, the
  default pre-filled, a select for the enum, a checkbox for the boolean; an answer that does not
  fit is told at its field and the card stays open; filled in and accepted, the card shows who
  answered, the timeline notes the question and the answer, and the tool result the model read
  holds exactly what was entered;
- a question answered elsewhere (the API, another person) turns the card on this page live.
"""

import json
from types import SimpleNamespace

import pytest

from tests.support.model_server import ScriptedModelServer, text_reply, tool_call, tool_reply

from ..integration.processes import served_embedded
from .test_outer_loop_ui import create_session, csrf_of, open_session, send, timeline, wait_idle
from .test_workspace import LIVE_TIMEOUT_MS, expect, log_in

TOOL = "example__ask_preference"
TOPIC = "the \u202eweiver review"  # an override the card must show by name

SETUP = """
from sessions_app.models import ModelConfig
from tenancy_app.models import Tenant
from tools_app.mcp.stdio import python_module_launch
from tools_app.mcp.sync import add_server, refresh_server
from tools_app.models import MCPServer, Tool, ToolSet

tenant = Tenant.objects.get(slug="demo")
ModelConfig.objects.update_or_create(
    tenant=tenant, name="scripted",
    defaults=dict(base_url="{base_url}", model="scripted-model", is_default=True, configured_by_operator=True),
)
launch = python_module_launch("tools_app.mcp.example_server")  # what `mcp_server add --python-module` records
server = add_server(
    tenant, "example", MCPServer.Transport.STDIO,
    command=launch.command, args=launch.args, env=launch.env, sandbox_read_paths=launch.read_paths,
)
refresh_server(server)
asking = ToolSet.objects.create(tenant=tenant, name="asking", is_default=True)
asking.tools.add(Tool.objects.get(tenant=tenant, name="{tool}"))
"""


def agent(request):
    """Each message asks the person once (call id `ask-<n>`, n = the user messages so far)."""
    last = request.messages[-1] if request.messages else {}
    if last.get("role") == "tool":
        return text_reply("Thanks, noted.")
    asked = sum(1 for m in request.messages if m["role"] == "user")
    return tool_reply(tool_call(TOOL, {"topic": TOPIC}, id=f"ask-{asked}"))


@pytest.fixture(scope="module")
def model_server():
    with ScriptedModelServer() as server:
        server.default("agent", agent)
        yield server


@pytest.fixture(scope="module")
def stack(tmp_path_factory, model_server):
    root = tmp_path_factory.mktemp("elicitation-stack")
    setup = SETUP.format(base_url=model_server.base_url, tool=TOOL)
    with served_embedded(root, ("seed_demo",), ("shell", "-c", setup)) as served:
        yield SimpleNamespace(**vars(served))


def field(card, name):
    return card.locator(f"[data-testid=input-field][data-field={name}]")


def tool_results(page, session_id) -> dict:
    messages = page.request.get(f"/api/v1/sessions/{session_id}/messages/").json()["results"]
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def test_the_card_renders_the_schema_and_an_accepted_answer_reaches_the_server(page):
    log_in(page)
    session = create_session(page, title="Drinks")
    open_session(page, session["id"])
    send(page, "Ask me what to bring")

    card = page.get_by_test_id("input-request-card")
    expect(card).to_have_count(1, timeout=LIVE_TIMEOUT_MS)
    expect(card).to_have_attribute("data-status", "pending")
    expect(card.get_by_test_id("input-server")).to_have_text("example")
    expect(card.get_by_test_id("input-message")).to_contain_text("⟨U+202E⟩weiver review")
    expect(card.locator(".input-required")).to_have_count(2)  # name and drink
    expect(field(card, "cups").locator("input")).to_have_value("2")  # the schema's default
    expect(field(card, "sugar").locator("input[type=checkbox]")).not_to_be_checked()
    options = field(card, "drink").locator("option").all_inner_texts()
    assert options[1:] == ["coffee", "tea", "water"]
    expect(field(card, "name")).to_contain_text("Who is answering")  # the description

    card.get_by_test_id("input-accept").click()  # nothing filled in: the server's rules answer
    expect(field(card, "name").get_by_test_id("input-field-error")).to_have_text("This field is required.")
    expect(field(card, "drink").get_by_test_id("input-field-error")).to_be_visible()
    expect(card).to_have_attribute("data-status", "pending")

    field(card, "name").locator("input").fill("Ann")
    field(card, "drink").locator("select").select_option("tea")
    field(card, "cups").locator("input").fill("3")
    field(card, "sugar").locator("input").check()
    card.get_by_test_id("input-accept").click()
    expect(card).to_have_attribute("data-status", "accepted")
    expect(card.get_by_test_id("input-outcome")).to_contain_text("Answered by demo")
    wait_idle(page)

    got = json.loads(tool_results(page, session["id"])["ask-1"])
    assert got == {"action": "accept", "content": {"name": "Ann", "drink": "tea", "cups": 3, "sugar": True}}
    notes = [item for item in timeline(page) if item and item.startswith("input-")]
    assert notes == ["input-requested-note", "input-answered-note"]


def test_an_answer_given_elsewhere_shows_on_the_card_live(page):
    log_in(page)
    session = create_session(page, title="Drinks elsewhere")
    open_session(page, session["id"])
    send(page, "Ask me again")
    card = page.get_by_test_id("input-request-card")
    expect(card).to_have_attribute("data-status", "pending", timeout=LIVE_TIMEOUT_MS)

    request_id = card.get_attribute("data-request-id")
    answered = page.request.post(
        f"/api/v1/sessions/{session['id']}/input-requests/{request_id}/answer/",
        data={"action": "decline"},
        headers={"X-CSRFToken": csrf_of(page)},
    )
    assert answered.status == 200, answered.text()
    expect(card).to_have_attribute("data-status", "declined")
    expect(card.get_by_test_id("input-outcome")).to_contain_text("Declined")
    expect(card.get_by_test_id("input-accept")).to_be_hidden()
    wait_idle(page)
    assert json.loads(tool_results(page, session["id"])["ask-1"]) == {"action": "decline"}
