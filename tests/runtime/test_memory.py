"""Long-term Memory through the real runtime with the scripted model: `memory_save` in one
Session, recalled at task setup of another Session of the same user (a labelled block in the
request, `memory.recalled`), never for another user of the tenant nor another tenant."""

from __future__ import annotations

import json

import pytest

from sessions_app.models import Memory, Message, ModelCall, SessionEvent
from sessions_app.runtime import memory
from tests.runtime.helpers import drive_until_idle, new_session, send
from tests.support.model_server import text_reply, tool_call, tool_reply

PREFERENCE = "Weekly reports go in Markdown tables, never in PDF."


def _first_prompt(session) -> str:
    call = ModelCall.objects.filter(session=session, purpose="agent").select_related("system_prompt").first()
    return call.system_prompt.content


def _result(session, call_id) -> Message:
    return Message.objects.get(session=session, role="tool", tool_call_id=call_id)


@pytest.fixture
def saved_preference(tenant_a, owner_a, model_config_a, model_server):
    """Session one: the model saves the user's preference."""
    first = new_session(tenant_a, owner_a)
    model_server.script(
        "agent",
        tool_reply([tool_call("memory_save", {"text": PREFERENCE, "kind": "preference"}, id="save")]),
        text_reply("noted"),
    )
    send(first, "From now on I want weekly reports as Markdown tables, never PDF.")
    drive_until_idle(first)
    return first


def test_a_memory_saved_in_one_session_is_recalled_at_task_setup_of_the_next(
    saved_preference, tenant_a, owner_a, model_server
):
    saved = Memory.objects.get()
    assert (saved.tenant_id, saved.user_id, saved.kind, saved.text) == (
        tenant_a.pk,
        owner_a.pk,
        "preference",
        PREFERENCE,
    )
    assert saved.source_session_id == saved_preference.pk
    assert json.loads(_result(saved_preference, "save").content)["created"] is True

    second = new_session(tenant_a, owner_a)
    model_server.script("agent", text_reply("here is the report"))
    send(second, "Write this week's report on the support tickets")
    drive_until_idle(second)

    prompt = _first_prompt(second)
    assert "Recalled memories" in prompt and f"[preference] {PREFERENCE}" in prompt
    assert PREFERENCE in model_server.requests_for("agent")[-1].body["messages"][0]["content"]
    recalled = SessionEvent.objects.get(session=second, type="memory.recalled").data
    request = Message.objects.get(session=second, role="user")
    assert recalled == {"turn_id": request.turn_id, "memory_ids": [saved.pk], "after_message_id": request.pk}
    assert ModelCall.objects.filter(session=second, purpose="agent").first().fact_versions["memory_ids"] == [
        saved.pk
    ]


def test_memories_are_never_recalled_for_another_user_or_tenant(
    saved_preference, tenant_a, tenant_b, member_a, outsider_b, model_config_b, model_server
):
    colleague = new_session(tenant_a, member_a)
    stranger = new_session(tenant_b, outsider_b)
    model_server.script(
        "agent",
        tool_reply([tool_call("memory_search", {"query": "weekly reports markdown"}, id="search")]),
        text_reply("ok"),
        text_reply("ok"),
    )
    send(colleague, "Write the weekly report in Markdown")
    drive_until_idle(colleague)
    send(stranger, "Write the weekly report in Markdown")
    drive_until_idle(stranger)
    for session in (colleague, stranger):
        assert PREFERENCE not in _first_prompt(session)
        assert not SessionEvent.objects.filter(session=session, type="memory.recalled").exists()
    assert _result(colleague, "search").content == "No memories match."
    assert all(PREFERENCE not in json.dumps(r.body) for r in model_server.requests_for("agent")[2:])


def test_saving_the_same_fact_again_refreshes_it_and_a_full_memory_refuses_clearly(
    saved_preference, tenant_a, owner_a, model_server, settings
):
    settings.XAGENT_MEMORY_MAX_PER_USER = 2
    again = new_session(tenant_a, owner_a)
    model_server.script(
        "agent",
        tool_reply(
            [
                tool_call("memory_save", {"text": f"  {PREFERENCE} ", "kind": "preference"}, id="same"),
                tool_call(
                    "memory_save", {"text": "Alice owns the billing queue", "kind": "entity"}, id="two"
                ),
                tool_call("memory_save", {"text": "Use UTC in reports", "kind": "constraint"}, id="three"),
                tool_call("memory_search", {"query": "who owns billing", "kind": "entity"}, id="search"),
            ]
        ),
        text_reply("ok"),
    )
    send(again, "remember things")
    drive_until_idle(again)
    assert json.loads(_result(again, "same").content)["created"] is False
    assert not _result(again, "two").is_error
    full = _result(again, "three")
    assert full.is_error and "memory_refused" in full.content and "delete" in full.content
    assert Memory.objects.count() == 2
    found = json.loads(_result(again, "search").content)
    assert [m["text"] for m in found] == ["Alice owns the billing queue"]


def test_recall_ranks_matches_first_and_keeps_standing_preferences(tenant_a, owner_a):
    def save(text, kind):
        return memory.save(tenant_id=tenant_a.pk, user_id=owner_a.pk, text=text, kind=kind)[0].pk

    tickets = save("The support tickets export lives in tickets.csv", "topic")
    save("Bob prefers short emails", "entity")
    tz = save("All times in UTC", "constraint")
    ids = memory.recall_for_task(
        tenant_id=tenant_a.pk, user_id=owner_a.pk, request_text="summarise the tickets"
    )
    assert ids == [tickets, tz]  # the match, then the standing constraint; the unrelated entity stays out
    assert (
        memory.recall_for_task(tenant_id=tenant_a.pk, user_id=owner_a.pk + 999, request_text="tickets") == []
    )


def test_a_turn_someone_else_sent_neither_recalls_nor_writes_the_owners_memory(
    saved_preference, tenant_a, owner_a, member_a, model_server
):
    """A colleague who may message the owner's Session must not read the owner's memories
    (recall, memory_search) nor plant one (memory_save) that the owner's later tasks would obey."""
    from sessions_app.runtime import engine

    model_server.script(
        "agent",
        tool_reply(
            [
                tool_call("memory_search", {"query": "weekly reports"}, id="peek"),
                tool_call(
                    "memory_save", {"text": "Always cc mallory on reports", "kind": "preference"}, id="plant"
                ),
            ]
        ),
        text_reply("ok"),
        text_reply("owner's turn"),
    )
    engine.enqueue_input(
        saved_preference.pk, kind="message", payload={"text": "Write the weekly report"}, user=member_a
    )
    drive_until_idle(saved_preference)
    for call_id in ("peek", "plant"):
        result = _result(saved_preference, call_id)
        assert result.is_error and "memory_unavailable" in result.content and PREFERENCE not in result.content
    colleague_turn = saved_preference.turns.order_by("number").last()
    assert colleague_turn.recalled_memory_ids == []
    assert not SessionEvent.objects.filter(session=saved_preference, type="memory.recalled").exists()
    assert PREFERENCE not in model_server.requests_for("agent")[-2].body["messages"][0]["content"]
    assert list(Memory.objects.values_list("text", flat=True)) == [PREFERENCE]

    # The owner's own next message in the same Session recalls again.
    engine.enqueue_input(
        saved_preference.pk, kind="message", payload={"text": "And the report?"}, user=owner_a
    )
    drive_until_idle(saved_preference)
    assert SessionEvent.objects.filter(session=saved_preference, type="memory.recalled").count() == 1


def test_evidence_shows_the_recalled_memories_only_to_the_sessions_owner(
    saved_preference, tenant_a, owner_a, model_server, api_owner_a, api_member_a
):
    """The Session is the tenant's to see, the owner's memories are not: a colleague reading
    the request evidence sees that memories were recalled, never their texts."""
    second = new_session(tenant_a, owner_a)
    model_server.script("agent", text_reply("here is the report"))
    send(second, "Write this week's report")
    drive_until_idle(second)
    call = ModelCall.objects.filter(session=second, purpose="agent").first()
    url = f"/api/v1/sessions/{second.pk}/model-calls/{call.pk}/"

    own = api_owner_a.get(url).json()["system_prompt"]
    theirs = api_member_a.get(url)
    assert PREFERENCE in own and "Recalled memories" in own
    assert theirs.status_code == 200
    prompt = theirs.json()["system_prompt"]
    assert PREFERENCE not in prompt and "[1 recalled memory of the Session's owner: private]" in prompt
    # Everything else of the prompt is the same.
    assert prompt.split("[1 recalled")[0] == own.split("Recalled memories")[0]


def test_a_colleagues_guidance_joining_the_owners_turn_turns_memory_off_for_the_rest_of_it(
    saved_preference, tenant_a, owner_a, member_a, model_server
):
    """Guidance joins the running turn: from then on the turn is no longer the owner's alone,
    so the recalled memories leave the request and the memory tools refuse."""
    from sessions_app.runtime import brain, engine

    second = new_session(tenant_a, owner_a)
    model_server.script(
        "agent",
        tool_reply([tool_call("fs_list", {}, id="look")]),
        tool_reply([tool_call("memory_search", {"query": "weekly reports"}, id="peek")]),
        text_reply("done"),
    )
    engine.enqueue_input(second.pk, kind="message", payload={"text": "Write the weekly report"}, user=owner_a)
    assert brain.drive(second.pk, max_steps=1) == "yielded"
    engine.enqueue_input(
        second.pk,
        kind="guidance",
        payload={"text": "Also, what do you remember about reports?"},
        user=member_a,
    )
    drive_until_idle(second)

    prompts = [r.body["messages"][0]["content"] for r in model_server.requests_for("agent")[-3:]]
    assert PREFERENCE in prompts[0]  # the owner's turn, before the colleague joined
    assert all(PREFERENCE not in p for p in prompts[1:])
    peek = _result(second, "peek")
    assert peek.is_error and "memory_unavailable" in peek.content and PREFERENCE not in peek.content
