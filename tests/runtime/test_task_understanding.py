"""The outer task loop (ARCHITECTURE §2, CONTRACT "Task-relation semantic call", SCENARIOS S6)
through the real runtime with the scripted model: a sub-Session understands each message with
one stateless `task_relation` call, Brain's transition sets the goals, `initialize`/`reconcile`
orchestrate capabilities add-only; a malformed answer is an `error` event and the turn runs."""

from __future__ import annotations

import json

import pytest

from sessions_app.models import Message, ModelCall, Session, SessionCapability, SessionEvent
from sessions_app.runtime import engine
from tests.runtime.helpers import drive_until_idle, event_types, new_session, send
from tests.runtime.test_skills_in_a_session import make_skill
from tests.support.model_server import Reply, error_reply, json_reply, text_reply, tool_call, tool_reply
from tools_app.models import Tool, ToolSet

# Recall runs in threads with their own connections: they must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)

RESEARCH_BODY = "# Research guide\n\nCite three primary sources (marker: RESEARCH-BODY-5521)."
DOCX_BODY = "# Word documents\n\nConvert with pandoc (marker: DOCX-BODY-8804)."

S6 = (
    "Research ComfyUI and deliver a Markdown guide",
    "Continue",
    "Convert the Markdown to Word",
    "Also check tomorrow's weather",
)


def relation(name, skills=(), tools=(), memory=(), **options):
    return json_reply(
        {
            "task_relation": name,
            "skill_recall_terms": list(skills),
            "tool_recall_terms": list(tools),
            "memory_recall_terms": list(memory),
        },
        **options,
    )


@pytest.fixture
def catalog(tenant_a):
    """What orchestration can find: two Skills, a tool set of document tools, one unrelated."""
    make_skill(
        tenant_a, "research-guide", "Research a software topic and write a Markdown guide.", RESEARCH_BODY
    )
    make_skill(tenant_a, "docx-writer", "Convert Markdown documents to Word (docx).", DOCX_BODY)
    make_skill(tenant_a, "sales-forecast", "Forecast quarterly sales from a CRM export.", "# Sales")
    conversion = ToolSet.objects.create(
        tenant=tenant_a, name="document-conversion", description="Convert documents: Markdown to Word, PDF"
    )
    conversion.tools.add(Tool.objects.get(tenant=None, name="shell_exec"))
    ToolSet.objects.create(tenant=tenant_a, name="weather", description="Weather forecasts by city")


@pytest.fixture
def sub_session(tenant_a, owner_a, model_config_a):
    main = new_session(tenant_a, owner_a, title="coordinator")
    return new_session(tenant_a, owner_a, title="research", kind="sub", parent=main)


def _capabilities(session) -> set[tuple[str, str]]:
    return set(SessionCapability.objects.filter(session=session).values_list("kind", "name"))


def _events(session, type_):
    return [e.data for e in SessionEvent.objects.filter(session=session, type=type_).order_by("seq")]


def test_s6_four_messages_in_a_sub_session(sub_session, catalog, model_server):
    model_server.script(
        "task_relation",
        relation("new_task", skills=["research", "markdown guide"], tools=["web research"]),
        relation("continue_current"),
        relation("change_within_session", skills=["word", "docx", "convert"], tools=["convert", "word"]),
        relation("out_of_scope", tools=["weather"]),
    )
    model_server.script(
        "orchestrate",
        json_reply({"skills": ["research-guide"], "toolsets": [], "tools": []}),
        json_reply({"skills": ["docx-writer"], "toolsets": ["document-conversion"], "tools": []}),
    )
    model_server.script("agent", *(text_reply(f"answer {n}") for n in range(1, 5)))

    goals, capabilities = [], [_capabilities(sub_session)]
    for text in S6:
        send(sub_session, text)
        drive_until_idle(sub_session)
        goals.append((sub_session.session_goal, sub_session.phase_goal))
        capabilities.append(_capabilities(sub_session))
        assert sub_session.status == "idle"

    understood = _events(sub_session, "task.understood")
    assert [e["task_relation"] for e in understood] == [
        "new_task",
        "continue_current",
        "change_within_session",
        "out_of_scope",
    ]
    first, _, convert, _ = S6
    assert goals == [(first, first), (first, first), (first, convert), (first, convert)]
    assert [(e["session_goal"], e["phase_goal"]) for e in understood] == goals
    assert [e["mode"] for e in understood] == ["initialize", None, "reconcile", None]

    # Orchestration ran exactly twice: initialize, then reconcile.
    assert len(model_server.requests_for("orchestrate")) == 2
    assert [e["mode"] for e in _events(sub_session, "orchestration.finished")] == ["initialize", "reconcile"]
    assert ModelCall.objects.filter(session=sub_session, purpose="orchestrate").count() == 2
    # Capabilities only grew, and reconcile added without removing.
    for before, after in zip(capabilities, capabilities[1:], strict=False):
        assert before <= after
    assert ("skill", "research-guide") in capabilities[1]
    assert {("skill", "docx-writer"), ("toolset", "document-conversion")} <= capabilities[3] - capabilities[2]
    assert capabilities[4] == capabilities[3]  # out of scope: nothing added
    added_by = dict(SessionCapability.objects.filter(session=sub_session).values_list("name", "added_by"))
    assert added_by["research-guide"] == added_by["docx-writer"] == "orchestrator"

    # The loaded Skill body is in the request evidence right after initialize.
    first_agent = ModelCall.objects.filter(session=sub_session, purpose="agent").order_by("id").first()
    assert "RESEARCH-BODY-5521" in first_agent.system_prompt.content
    assert first_agent.fact_versions["skills"] == {"research-guide": 1}
    agent_requests = model_server.requests_for("agent")
    assert "RESEARCH-BODY-5521" in agent_requests[0].messages[0]["content"]
    assert "DOCX-BODY-8804" in agent_requests[2].messages[0]["content"]
    assert "shell_exec" in agent_requests[2].tool_names  # the tool set's tool arrived with reconcile
    # Both goals are always in the request.
    system = agent_requests[3].messages[0]["content"]
    assert f"Session goal: {first}" in system and f"Current phase goal: {convert}" in system


def test_the_task_relation_call_sees_only_the_message_its_resources_and_the_goals(
    sub_session, catalog, model_server
):
    model_server.script("task_relation", relation("new_task", skills=["research"]))
    model_server.script("orchestrate", json_reply({"skills": [], "toolsets": [], "tools": []}))
    model_server.script("agent", text_reply("done"))
    (engine.workspace_path(sub_session) / "notes.md").write_text("# notes")
    engine.enqueue_input(sub_session.pk, kind="message", payload={"text": S6[0], "attachments": ["notes.md"]})
    drive_until_idle(sub_session)

    (request,) = model_server.requests_for("task_relation")
    assert request.body["stream"] is False and "tools" not in request.body
    assert [m["role"] for m in request.messages] == ["system", "user"]
    asked = json.loads(request.messages[1]["content"])
    assert asked == {
        "message": S6[0],
        "resources": ["notes.md"],
        "current_phase_goal": None,
        "session_goal": None,
    }
    # Orchestration saw names and descriptions, never a score.
    (orchestrate,) = model_server.requests_for("orchestrate")
    payload = json.loads(orchestrate.messages[1]["content"])
    assert [s["name"] for s in payload["candidates"]["skills"]] == ["research-guide"]
    assert "score" not in orchestrate.messages[1]["content"]
    evidence = ModelCall.objects.get(session=sub_session, purpose="task_relation")
    assert evidence.fact_versions["request"] == asked
    assert evidence.fact_versions["answer"]["task_relation"] == "new_task"


def _terms(count):
    return [f"term {n}" for n in range(count)]


MALFORMED = {
    "bad JSON": text_reply('{"task_relation": "new_task", "skill_recall_terms": ['),
    "not an object": json_reply(["new_task"]),
    "wrong enum": relation("maybe"),
    "extra keys": json_reply(
        {
            "task_relation": "new_task",
            "skill_recall_terms": [],
            "tool_recall_terms": [],
            "memory_recall_terms": [],
            "confidence": 0.9,
        }
    ),
    "missing key": json_reply(
        {"task_relation": "new_task", "skill_recall_terms": [], "tool_recall_terms": []}
    ),
    "more than 16 terms": relation("new_task", skills=_terms(17)),
    "null array": json_reply(
        {
            "task_relation": "new_task",
            "skill_recall_terms": None,
            "tool_recall_terms": [],
            "memory_recall_terms": [],
        }
    ),
    "repeated terms": relation("new_task", skills=["word", "word"]),
    "not strings": relation("new_task", tools=[3]),
    "truncated": Reply(text='{"task_relation": "new_', finish_reason="length"),
    "server error": error_reply(500, times=2),
}


@pytest.mark.parametrize("answer", list(MALFORMED), ids=list(MALFORMED))
def test_a_malformed_answer_keeps_the_input_runs_the_turn_and_leaves_goals_alone(
    answer, sub_session, catalog, model_server
):
    engine.update_goals(sub_session.pk, session_goal="Ship the docs", phase_goal="Write the guide", by="test")
    before = _capabilities(sub_session)
    model_server.script("task_relation", MALFORMED[answer])
    model_server.script("agent", text_reply("worked on it anyway"))
    send(sub_session, "Convert the Markdown to Word")
    drive_until_idle(sub_session)

    # The input was kept and the turn ran to its end.
    assert Message.objects.filter(
        session=sub_session, role="user", content="Convert the Markdown to Word"
    ).exists()
    assert Message.objects.filter(
        session=sub_session, role="assistant", content="worked on it anyway"
    ).exists()
    assert sub_session.status == "idle"
    errors = _events(sub_session, "error")
    assert [e["code"] for e in errors] == ["task_relation_failed"]
    assert "goals and capabilities are unchanged" in errors[0]["message"]
    assert (sub_session.session_goal, sub_session.phase_goal) == ("Ship the docs", "Write the guide")
    assert _capabilities(sub_session) == before
    assert "task.understood" not in event_types(sub_session)
    assert not model_server.requests_for("orchestrate")
    # The statuses users saw: preparing, then running, then idle.
    statuses = [e["status"] for e in _events(sub_session, "session.status")]
    assert statuses[-3:] == ["preparing", "running", "idle"]


def test_a_task_relation_call_that_times_out_is_a_failed_preprocess(sub_session, model_server, settings):
    settings.XAGENT_PREPARE_TIMEOUT_SECONDS = 1
    model_server.script("task_relation", relation("new_task", delay_before_s=3, times=2))
    model_server.script("agent", text_reply("still answered"))
    send(sub_session, S6[0])
    drive_until_idle(sub_session)
    (error,) = _events(sub_session, "error")
    assert error["code"] == "task_relation_failed" and "timed out" in error["message"].lower()
    assert sub_session.phase_goal == "" and sub_session.status == "idle"
    call = ModelCall.objects.get(session=sub_session, purpose="task_relation")
    assert call.attempts == 2 and call.finish_reason == "error"


@pytest.mark.parametrize(
    "answer",
    [
        json_reply({"skills": ["no-such-skill"], "toolsets": [], "tools": []}),
        json_reply({"skills": ["research-guide"]}),
        json_reply({"skills": "research-guide", "toolsets": [], "tools": []}),
        text_reply("I would pick research-guide"),
    ],
    ids=["not a candidate", "missing keys", "not an array", "prose"],
)
def test_a_malformed_orchestration_leaves_capabilities_as_they_were(
    answer, sub_session, catalog, model_server
):
    before = _capabilities(sub_session)
    model_server.script("task_relation", relation("new_task", skills=["research guide"]))
    model_server.script("orchestrate", answer)
    model_server.script("agent", text_reply("done"))
    send(sub_session, S6[0])
    drive_until_idle(sub_session)
    assert [e["code"] for e in _events(sub_session, "error")] == ["orchestration_failed"]
    assert _capabilities(sub_session) == before
    # The understanding itself stood: the goals were set.
    assert sub_session.phase_goal == S6[0]
    assert Message.objects.filter(session=sub_session, role="assistant", content="done").exists()


def test_a_skill_too_large_for_the_budget_is_refused_by_orchestration(sub_session, model_server, tenant_a):
    make_skill(tenant_a, "huge-guide", "A research guide of great length.", "word " * 40000)
    model_server.script("task_relation", relation("new_task", skills=["research guide"]))
    model_server.script("orchestrate", json_reply({"skills": ["huge-guide"], "toolsets": [], "tools": []}))
    model_server.script("agent", text_reply("done"))
    send(sub_session, S6[0])
    drive_until_idle(sub_session)
    (finished,) = _events(sub_session, "orchestration.finished")
    assert finished["added"]["skills"] == [] and finished["refused"][0]["skill"] == "huge-guide"
    assert ("skill", "huge-guide") not in _capabilities(sub_session)


def test_a_main_session_skips_task_understanding(tenant_a, owner_a, model_config_a, catalog, model_server):
    main = new_session(tenant_a, owner_a)
    model_server.script("agent", text_reply("done"))
    send(main, S6[0])
    drive_until_idle(main)
    assert not model_server.requests_for("task_relation")
    assert "task.understood" not in event_types(main)
    assert (main.session_goal, main.phase_goal) == (S6[0], S6[0])
    assert "preparing" not in [e["status"] for e in _events(main, "session.status")]


def test_guidance_and_session_events_skip_task_understanding(sub_session, model_server):
    model_server.script("agent", text_reply("ok"), text_reply("ok"))
    send(sub_session, "a steer", kind="guidance")
    drive_until_idle(sub_session)
    engine.enqueue_input(sub_session.pk, kind="session_event", payload={"text": "[Session event] done"})
    drive_until_idle(sub_session)
    assert not model_server.requests_for("task_relation")
    assert Session.objects.get(pk=sub_session.pk).turns.count() == 2


def test_an_interrupt_while_understanding_stops_the_turn(sub_session, model_server):
    import threading

    from sessions_app.runtime import brain

    model_server.script("task_relation", relation("new_task", delay_before_s=5))
    send(sub_session, S6[0])
    timer = threading.Timer(0.5, lambda: brain.interrupt(sub_session))
    timer.start()
    drive_until_idle(sub_session)
    timer.join()
    assert sub_session.status == "interrupted"
    turn = sub_session.turns.get()
    assert turn.reason == "aborted"
    call = ModelCall.objects.get(session=sub_session, purpose="task_relation")
    assert call.finish_reason == "cancelled"
    assert "task.understood" not in event_types(sub_session) and not model_server.requests_for("agent")
    assert Message.objects.filter(session=sub_session, role="user", content=S6[0]).exists()


def test_a_runner_lost_while_preparing_leaves_the_turn_to_be_understood_again(sub_session, model_server):
    from datetime import timedelta

    from django.utils import timezone

    from sessions_app.runtime import brain

    send(sub_session, S6[0])
    token = brain.acquire(sub_session.pk)
    (queued,) = engine.queued_inputs(sub_session.pk)
    engine.start_turn(sub_session.pk, token, queued)
    assert Session.objects.get(pk=sub_session.pk).status == "preparing"
    # The worker dies here; its lease lapses and another runner takes over.
    Session.objects.filter(pk=sub_session.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    model_server.script("task_relation", relation("new_task"))
    model_server.script("agent", text_reply("done after recovery"))
    drive_until_idle(sub_session)
    (recovered,) = _events(sub_session, "session.recovered")
    assert "understood again" in recovered["next"]
    assert [e["task_relation"] for e in _events(sub_session, "task.understood")] == ["new_task"]
    assert sub_session.status == "idle" and sub_session.phase_goal == S6[0]


def test_a_sub_session_needs_an_open_main_session_as_parent(tenant_a, owner_a, api_owner_a):
    main = new_session(tenant_a, owner_a)
    sub = new_session(tenant_a, owner_a, kind="sub", parent=main)
    for body in (
        {"kind": "sub", "parent": str(sub.pk)},
        {"kind": "main", "parent": str(main.pk)},
        {"parent": str(main.pk)},
    ):
        answer = api_owner_a.post("/api/v1/sessions/", body, format="json")
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "validation_error", body
    assert (
        api_owner_a.post(
            "/api/v1/sessions/", {"kind": "sub", "parent": str(main.pk)}, format="json"
        ).status_code
        == 201
    )


def _prepare_and_count(tenant, owner, main, model_server) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from sessions_app.runtime import brain, outer_loop
    from sessions_app.runtime.agent import AgentService

    model_server.script("task_relation", relation("new_task", skills=["research"], tools=["convert"]))
    model_server.default(
        "orchestrate", lambda request: json_reply({"skills": [], "toolsets": [], "tools": []})
    )
    session = new_session(tenant, owner, kind="sub", parent=main)
    send(session, S6[0])
    token = brain.acquire(session.pk)
    (queued,) = engine.queued_inputs(session.pk)
    turn = engine.start_turn(session.pk, token, queued)
    agent = AgentService(session.pk, token)
    try:
        with CaptureQueriesContext(connection) as queries:
            outer_loop.prepare_turn(agent, turn.pk)
    finally:
        agent.close()
    assert Session.objects.get(pk=session.pk).status == "running"
    return len(queries.captured_queries)


def test_preparing_a_turn_costs_the_same_queries_whatever_the_catalogue_size(
    tenant_a, owner_a, model_config_a, model_server, settings
):
    settings.XAGENT_RECALL_PARALLEL = False  # every recall query counted in this thread
    main = new_session(tenant_a, owner_a)
    make_skill(tenant_a, "research-guide", "Research a topic.", RESEARCH_BODY)
    ToolSet.objects.create(tenant=tenant_a, name="convert", description="convert documents")
    _prepare_and_count(tenant_a, owner_a, main, model_server)  # the first stores the prompts
    small = _prepare_and_count(tenant_a, owner_a, main, model_server)
    for n in range(30):
        make_skill(tenant_a, f"research-extra-{n}", f"Research variant {n}.", "# body")
        ToolSet.objects.create(tenant=tenant_a, name=f"convert-{n}", description="convert documents")
    large = _prepare_and_count(tenant_a, owner_a, main, model_server)
    assert small == large


@pytest.mark.parametrize(
    "purpose, answer",
    [
        ("task_relation", relation("new_task", skills=["a\u0000b", "c\ud800d"])),
        ("task_relation", text_reply("not json \u0000 \ud800")),
        ("orchestrate", json_reply({"skills": ["x\u0000y"], "toolsets": [], "tools": []})),
    ],
    ids=["NUL and a lone surrogate in terms", "in a non-JSON answer", "in an orchestrate answer"],
)
def test_text_postgresql_cannot_store_never_costs_the_turn(
    purpose, answer, sub_session, catalog, model_server
):
    if purpose == "task_relation":
        model_server.script("task_relation", answer)
    else:
        model_server.script("task_relation", relation("new_task", skills=["research"]))
        model_server.script("orchestrate", answer)
    model_server.script("agent", text_reply("ran anyway"))
    send(sub_session, S6[0])
    drive_until_idle(sub_session)
    assert sub_session.status == "idle"
    assert Message.objects.filter(session=sub_session, role="assistant", content="ran anyway").exists()
    stored = json.dumps(list(SessionEvent.objects.filter(session=sub_session).values_list("data", flat=True)))
    assert "\\u0000" not in stored and "\\ud800" not in stored


def test_a_whole_answer_must_arrive_within_the_limit_however_slowly_bytes_come():
    import time

    from sessions_app.runtime.llm.openai_provider import AnswerTimeout, _post_until_cancelled

    def trickling():
        time.sleep(2)  # a server sending one byte at a time, each within the read timeout
        return "never read"

    started = time.monotonic()
    with pytest.raises(AnswerTimeout, match="timed out"):
        _post_until_cancelled(trickling, None, deadline=0.2)
    assert time.monotonic() - started < 2  # the caller did not wait for the trickle


def test_out_of_range_usage_is_clamped_not_a_crash(sub_session, model_server):
    model_server.script(
        "task_relation", relation("new_task", usage={"prompt_tokens": -5, "completion_tokens": 1})
    )
    model_server.script(
        "agent", text_reply("ok", usage={"prompt_tokens": 99_999_999_999, "completion_tokens": 3})
    )
    send(sub_session, S6[0])
    drive_until_idle(sub_session)
    assert sub_session.status == "idle"
    call = ModelCall.objects.get(session=sub_session, purpose="agent")
    assert call.prompt_tokens == 2**31 - 1
    assert ModelCall.objects.get(session=sub_session, purpose="task_relation").prompt_tokens == 0


def test_a_sub_session_never_gets_the_delegate_tool(
    sub_session, catalog, model_server, tenant_a, api_owner_a
):
    coordinators = ToolSet.objects.create(tenant=tenant_a, name="coordination", description="delegate work")
    coordinators.tools.add(Tool.objects.get(tenant=None, name="session_delegate"))
    model_server.script("task_relation", relation("new_task", tools=["session delegate", "delegate"]))
    model_server.script("orchestrate", json_reply({"skills": [], "toolsets": ["coordination"], "tools": []}))
    model_server.script(
        "agent",
        tool_reply([tool_call("tools_select", {"names": ["session_delegate"]}, id="sel")]),
        text_reply("done"),
    )
    send(sub_session, S6[0])
    drive_until_idle(sub_session)
    (finished,) = _events(sub_session, "orchestration.finished")
    assert "session_delegate" not in finished["candidates"]["tools"]
    # Even the tool set an admin put it in does not give it to a sub-Session.
    for request in model_server.requests_for("agent"):
        assert "session_delegate" not in request.tool_names
    selected = Message.objects.get(session=sub_session, role="tool", tool_call_id="sel")
    assert selected.is_error and "session_delegate" in selected.content
    detail = api_owner_a.get(f"/api/v1/sessions/{sub_session.pk}/").json()
    assert "session_delegate" not in detail["capabilities"]["tools"]
    parent = api_owner_a.get(f"/api/v1/sessions/{sub_session.parent_id}/").json()
    assert "session_delegate" in parent["capabilities"]["tools"]


def test_a_goal_of_only_spaces_is_no_goal(sub_session, model_server, api_owner_a):
    answer = api_owner_a.patch(
        f"/api/v1/sessions/{sub_session.pk}/", {"session_goal": "   ", "phase_goal": " \n "}, format="json"
    )
    assert answer.status_code == 200 and (answer.json()["session_goal"], answer.json()["phase_goal"]) == (
        "",
        "",
    )
    model_server.script("task_relation", relation("continue_current"))
    model_server.script("agent", text_reply("done"))
    send(sub_session, S6[0])
    drive_until_idle(sub_session)
    # No phase goal yet: the message is the first task, whatever the relation said.
    assert (sub_session.session_goal, sub_session.phase_goal) == (S6[0], S6[0])


def test_an_orchestration_failure_says_the_goals_stand(sub_session, catalog, model_server):
    model_server.script("task_relation", relation("new_task", skills=["research"]))
    model_server.script("orchestrate", text_reply("no idea"))
    model_server.script("agent", text_reply("done"))
    send(sub_session, S6[0])
    drive_until_idle(sub_session)
    (error,) = _events(sub_session, "error")
    assert (
        "capabilities are unchanged" in error["message"]
        and "goals task understanding set stand" in error["message"]
    )
    assert sub_session.phase_goal == S6[0]
