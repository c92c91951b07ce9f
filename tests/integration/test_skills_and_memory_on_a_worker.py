"""Skills and Memory on the production path: a Skill imported with `manage.py skill_import`, a
Session driven through the REST API and run by a separate Celery worker over Redis and
PostgreSQL, the scripted model on loopback. The model finds and loads the Skill (the next
request's evidence holds its body) and saves a memory, which the user's next Session recalls.
Another tenant neither sees the Skill nor the memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sessions_app.models import Turn
from skills_app.models import Skill
from tests.support.model_server import text_reply, tool_call, tool_reply
from tests.tenancy.isolation import assert_cross_tenant_404

from .conftest import wait_for
from .processes import database_env_for_workers, manage

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "skills" / "research-guide"
PREFERENCE = "Guides are written in British English with a glossary at the end."


def _run(client, worker, text: str, title: str) -> str:
    session_id = client.post("/api/v1/sessions/", {"title": title}, format="json").json()["id"]
    assert (
        client.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": text}, format="json").status_code
        == 202
    )
    wait_for(lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").exists(), worker)
    assert Turn.objects.get(session_id=session_id).reason == "completed"
    return session_id


def _evidence(client, session_id) -> list[dict]:
    calls = client.get(f"/api/v1/sessions/{session_id}/model-calls/?purpose=agent").json()["results"]
    return [client.get(f"/api/v1/sessions/{session_id}/model-calls/{c['id']}/").json() for c in calls]


def test_an_imported_skill_is_found_loaded_and_a_memory_carries_to_the_next_session(
    tenant_a, api_owner_a, api_outsider_b, model_config_a, model_server, worker
):
    imported = manage(database_env_for_workers(), "skill_import", str(FIXTURE), "--tenant", tenant_a.slug)
    assert imported.stdout.strip() == "research-guide"
    skill = Skill.objects.get(tenant=tenant_a, name="research-guide")
    marker = skill.body.strip().splitlines()[-1]  # a line of the body only loading can show

    listed = api_owner_a.get("/api/v1/skills/").json()["results"]
    assert [s["name"] for s in listed if s["source"] == "tenant"] == ["research-guide"]
    assert_cross_tenant_404(api_outsider_b, f"/api/v1/skills/{skill.pk}/", methods=("get",), hidden=[marker])

    model_server.script(
        "agent",
        tool_reply([tool_call("skills_find", {"query": "research a software topic guide"}, id="find")]),
        tool_reply([tool_call("skills_load", {"skills": ["research-guide"]}, id="load")]),
        tool_reply([tool_call("memory_save", {"text": PREFERENCE, "kind": "preference"}, id="save")]),
        text_reply("The guide is ready."),
    )
    first = _run(api_owner_a, worker, "Research ComfyUI and deliver a Markdown guide", "research")
    evidence = _evidence(api_owner_a, first)
    assert len(evidence) == 4
    assert marker not in evidence[1]["system_prompt"] and "research-guide:" in evidence[0]["system_prompt"]
    assert marker in evidence[2]["system_prompt"] and evidence[2]["fact_versions"]["skills"] == {
        "research-guide": 1
    }
    find_result = api_owner_a.get(f"/api/v1/sessions/{first}/messages/").json()["results"]
    found = json.loads(next(m["content"] for m in find_result if m["tool_call_id"] == "find"))
    assert [f["name"] for f in found] == ["research-guide"]

    model_server.script("agent", text_reply("Here is the next guide."))
    second = _run(api_owner_a, worker, "Write a guide to Markdown tables", "next")
    prompt = _evidence(api_owner_a, second)[0]["system_prompt"]
    assert "Recalled memories" in prompt and PREFERENCE in prompt
    memories = api_owner_a.get("/api/v1/memories/").json()["results"]
    assert [(m["text"], m["source_session"]) for m in memories] == [(PREFERENCE, first)]
    assert api_outsider_b.get("/api/v1/memories/").json()["results"] == []
