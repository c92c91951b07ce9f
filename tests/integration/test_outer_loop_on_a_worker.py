"""The outer task loop on the production path (SCENARIOS S6, ARCHITECTURE §2): Sessions driven
through the REST API, run by a separate Celery worker over Redis and PostgreSQL, the scripted
model on loopback the only stand-in.

S6: the four messages in a sub-Session — new_task / continue_current / change_within_session /
out_of_scope — set the goals by the CONTRACT table, orchestration runs exactly twice (initialize,
reconcile), capabilities only grow, and the Skill orchestration loaded is in the next request's
evidence. Delegation: a MainSession delegates; the sub-Session understands and completes on the
worker; its result returns to the MainSession, which answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sessions_app.models import ModelCall, Session, Turn
from tests.support.model_server import json_reply, text_reply, tool_call, tool_reply
from tests.tenancy.isolation import assert_cross_tenant_404
from tools_app.models import Tool, ToolSet

from .conftest import wait_for
from .processes import database_env_for_workers, manage

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

SKILLS = Path(__file__).resolve().parents[1] / "fixtures" / "skills"
S6 = (
    "Research ComfyUI and deliver a Markdown guide",
    "Continue",
    "Convert the Markdown to Word",
    "Also check tomorrow's weather",
)


def relation(name, skills=(), tools=()):
    return json_reply(
        {
            "task_relation": name,
            "skill_recall_terms": list(skills),
            "tool_recall_terms": list(tools),
            "memory_recall_terms": [],
        }
    )


def _ended_turns(session_id) -> int:
    return Turn.objects.filter(session_id=session_id).exclude(reason="").count()


def _capabilities(client, session_id) -> set[tuple[str, str]]:
    detail = client.get(f"/api/v1/sessions/{session_id}/").json()
    return {(c["kind"], c["name"]) for c in detail["capability_sources"]}


def _events(client, session_id, type_) -> list[dict]:
    events = client.get(f"/api/v1/sessions/{session_id}/events/").json()["events"]
    return [e["data"] for e in events if e["type"] == type_]


def test_s6_task_understanding_in_a_sub_session(
    tenant_a, api_owner_a, api_outsider_b, model_config_a, model_server, worker
):
    imported = manage(
        database_env_for_workers(), "skill_import", str(SKILLS / "research-guide"), "--tenant", tenant_a.slug
    )
    assert imported.stdout.strip() == "research-guide"
    conversion = ToolSet.objects.create(
        tenant=tenant_a, name="document-conversion", description="Convert Markdown documents to Word and PDF"
    )
    conversion.tools.add(Tool.objects.get(tenant=None, name="shell_exec"))

    main = api_owner_a.post("/api/v1/sessions/", {"title": "coordinator"}, format="json").json()["id"]
    created = api_owner_a.post(
        "/api/v1/sessions/", {"title": "research", "kind": "sub", "parent": main}, format="json"
    )
    assert created.status_code == 201, created.content
    sub = created.json()["id"]

    model_server.script(
        "task_relation",
        relation("new_task", skills=["research", "guide", "software topic"]),
        relation("continue_current"),
        relation("change_within_session", tools=["convert", "word", "markdown"]),
        relation("out_of_scope", tools=["weather"]),
    )
    model_server.script(
        "orchestrate",
        json_reply({"skills": ["research-guide"], "toolsets": [], "tools": []}),
        json_reply({"skills": [], "toolsets": ["document-conversion"], "tools": []}),
    )
    model_server.script("agent", *(text_reply(f"answer {n}") for n in range(1, 5)))

    goals, capabilities = [], [_capabilities(api_owner_a, sub)]
    for number, text in enumerate(S6, start=1):
        sent = api_owner_a.post(f"/api/v1/sessions/{sub}/inputs/", {"text": text}, format="json")
        assert sent.status_code == 202
        wait_for(lambda n=number: _ended_turns(sub) == n, worker)
        detail = api_owner_a.get(f"/api/v1/sessions/{sub}/").json()
        goals.append((detail["session_goal"], detail["phase_goal"]))
        capabilities.append(_capabilities(api_owner_a, sub))

    understood = _events(api_owner_a, sub, "task.understood")
    assert [e["task_relation"] for e in understood] == [
        "new_task",
        "continue_current",
        "change_within_session",
        "out_of_scope",
    ]
    first, _, convert, _ = S6
    assert goals == [(first, first), (first, first), (first, convert), (first, convert)]
    assert len(model_server.requests_for("orchestrate")) == 2
    assert [e["mode"] for e in _events(api_owner_a, sub, "orchestration.finished")] == [
        "initialize",
        "reconcile",
    ]
    for before, after in zip(capabilities, capabilities[1:], strict=False):
        assert before <= after
    assert ("skill", "research-guide") in capabilities[1]
    assert ("toolset", "document-conversion") in capabilities[3] - capabilities[2]

    # The loaded Skill body is in the evidence of the first step after initialize.
    body_line = next(
        line
        for line in (SKILLS / "research-guide" / "SKILL.md").read_text().splitlines()[::-1]
        if line.strip()
    )
    calls = api_owner_a.get(f"/api/v1/sessions/{sub}/model-calls/?purpose=agent").json()["results"]
    first_step = api_owner_a.get(f"/api/v1/sessions/{sub}/model-calls/{calls[0]['id']}/").json()
    assert body_line in first_step["system_prompt"]
    assert first_step["fact_versions"]["skills"] == {"research-guide": 1}
    assert ModelCall.objects.filter(session_id=sub, purpose="task_relation").count() == 4
    # Another tenant sees none of it.
    assert_cross_tenant_404(
        api_outsider_b, f"/api/v1/sessions/{sub}/", methods=("get", "patch"), hidden=[first]
    )


def test_a_main_session_delegates_and_the_result_returns_on_a_worker(
    tenant_a, api_owner_a, model_config_a, model_server, worker
):
    manage(
        database_env_for_workers(), "skill_import", str(SKILLS / "research-guide"), "--tenant", tenant_a.slug
    )
    request = "Research ComfyUI and deliver a Markdown guide"

    def agent(recorded):
        """Both Sessions run at once on the worker: answer by whose request it is."""
        history = recorded.messages
        if "session_delegate" in recorded.tool_names:  # the MainSession
            if any(str(m.get("content", "")).startswith("[Session event") for m in history):
                return text_reply("Your guide is in the from- folder.")
            if history[-1]["role"] == "tool":
                return text_reply("A sub-Session is on it.")
            return tool_reply([tool_call("session_delegate", {"request": request}, id="d1")])
        if history[-1]["role"] == "tool":  # the sub-Session, after writing
            return text_reply("guide.md is written.")
        return tool_reply([tool_call("fs_write", {"path": "guide.md", "content": "# ComfyUI\n"}, id="w1")])

    model_server.default("agent", agent)
    model_server.script("task_relation", relation("new_task", skills=["research", "guide"]))
    model_server.script(
        "orchestrate", json_reply({"skills": ["research-guide"], "toolsets": [], "tools": []})
    )
    main = api_owner_a.post("/api/v1/sessions/", {"title": "coordinator"}, format="json").json()["id"]
    api_owner_a.post(f"/api/v1/sessions/{main}/inputs/", {"text": "Get me a ComfyUI guide"}, format="json")
    wait_for(lambda: Session.objects.filter(parent_id=main).exists(), worker)
    child = Session.objects.get(parent_id=main)
    # The MainSession's own turn, the sub-Session's turn, then the MainSession's turn for its result.
    wait_for(lambda: _ended_turns(main) == 2, worker, timeout=90)
    assert _ended_turns(child.pk) == 1

    child_detail = api_owner_a.get(f"/api/v1/sessions/{child.pk}/").json()
    assert child_detail["parent"] == main and child_detail["phase_goal"] == request
    assert [
        (c["kind"], c["name"], c["added_by"])
        for c in child_detail["capability_sources"]
        if c["kind"] == "skill"
    ] == [("skill", "research-guide", "orchestrator")]
    assert api_owner_a.get(f"/api/v1/sessions/{main}/").json()["children"][0]["id"] == str(child.pk)
    messages = api_owner_a.get(f"/api/v1/sessions/{main}/messages/").json()["results"]
    (report,) = [m for m in messages if m["input_kind"] == "session_event"]
    assert "guide.md is written." in report["content"]
    files = [f["path"] for f in api_owner_a.get(f"/api/v1/sessions/{main}/files/").json()]
    assert f"from-{str(child.pk)[:8]}/guide.md" in files
    handed = json.loads(next(m["content"] for m in messages if m["tool_call_id"] == "d1"))
    assert handed["session_id"] == str(child.pk)
