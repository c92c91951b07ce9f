"""Main and sub-Sessions (ARCHITECTURE §2): `session_delegate` hands the original request and
resource references to a sub-Session, which understands the task and chooses its capabilities
itself; its result returns to the MainSession as a `session_event` input. Goals are a person's
to edit (PATCH), and every request shows them."""

from __future__ import annotations

import json

import pytest

from sessions_app.models import Input, Message, Session, SessionCapability, SessionEvent
from sessions_app.runtime import engine
from tests.runtime.helpers import assert_tool_pairs, drive_until_idle, event_types, new_session, send
from tests.runtime.test_skills_in_a_session import make_skill
from tests.runtime.test_task_understanding import relation
from tests.support.model_server import json_reply, text_reply, tool_call, tool_reply
from tests.tenancy.isolation import assert_cross_tenant_404

pytestmark = pytest.mark.django_db(transaction=True)

REQUEST = "Research ComfyUI and deliver a Markdown guide"


@pytest.fixture
def main(tenant_a, owner_a, model_config_a):
    session = new_session(tenant_a, owner_a, title="coordinator")
    (engine.workspace_path(session) / "notes.md").write_text("# What the user knows\n- nodes\n")
    return session


def _results(session):
    return {m.tool_call_id: m for m in Message.objects.filter(session=session, role="tool")}


def test_a_main_session_delegates_and_the_result_comes_back(main, tenant_a, model_server):
    make_skill(tenant_a, "research-guide", "Research a software topic and write a Markdown guide.", "# R")
    model_server.script(
        "agent",
        # The MainSession hands the task over with the user's words and the file it needs.
        tool_reply([tool_call("session_delegate", {"request": REQUEST, "files": ["notes.md"]}, id="d1")]),
        text_reply("I asked a sub-Session to research it."),
        # The sub-Session's own turn: it writes the guide.
        tool_reply(
            [tool_call("fs_write", {"path": "guide.md", "content": "# ComfyUI\n\nA node UI.\n"}, id="w1")]
        ),
        text_reply("The guide is in guide.md."),
        # Back in the MainSession, a turn for the session event.
        text_reply("The sub-Session delivered guide.md."),
    )
    model_server.script("task_relation", relation("new_task", skills=["research", "guide"]))
    model_server.script(
        "orchestrate", json_reply({"skills": ["research-guide"], "toolsets": [], "tools": []})
    )

    send(main, "Please get me a ComfyUI guide; delegate it.")
    drive_until_idle(main)
    assert "session_delegate" in model_server.requests_for("agent")[0].tool_names
    handed = json.loads(_results(main)["d1"].content)
    child = Session.objects.get(pk=handed["session_id"])
    assert (child.kind, child.parent_id, child.owner_id) == ("sub", main.pk, main.owner_id)
    assert handed["files"] == ["notes.md"] and not handed["reused"]
    assert (engine.workspace_path(child) / "notes.md").read_text().startswith("# What the user knows")
    # Only the original request and the resource references were sent.
    (sent,) = Input.objects.filter(session=child)
    assert sent.payload["text"] == REQUEST and sent.payload["attachments"] == ["notes.md"]
    assert sent.payload["delegated_by"] == str(main.pk)
    # The parent preselected nothing: the child's only capabilities are its own choice.
    assert not SessionCapability.objects.filter(session=child).exclude(
        added_by__in=["default", "orchestrator"]
    )

    drive_until_idle(child)
    assert child.status == "idle" and child.phase_goal == REQUEST
    assert (
        "session_delegate" not in model_server.requests_for("agent")[2].tool_names
    )  # a sub-Session does not delegate
    assert list(
        SessionCapability.objects.filter(session=child, kind="skill").values_list("name", "added_by")
    ) == [("research-guide", "orchestrator")]

    # The result is queued in the MainSession as a session event and starts a turn there.
    (event,) = Input.objects.filter(session=main, kind="session_event")
    assert event.payload["session_id"] == str(child.pk) and event.payload["reason"] == "completed"
    drive_until_idle(main)
    report = Message.objects.get(session=main, input=event)
    assert report.content.startswith("[Session event: not a message from the user]")
    assert "The guide is in guide.md." in report.content
    copied = f"from-{str(child.pk)[:8]}/guide.md"
    assert copied in report.content
    assert (engine.workspace_path(main) / copied).read_text().startswith("# ComfyUI")
    assert main.status == "idle"
    assert Message.objects.filter(session=main, content="The sub-Session delivered guide.md.").exists()
    assert "task.understood" not in event_types(main)  # a MainSession skips task understanding
    assert_tool_pairs(main)


def test_a_follow_up_goes_to_the_same_sub_session(main, model_server):
    model_server.script(
        "agent",
        tool_reply([tool_call("session_delegate", {"request": REQUEST, "title": "ComfyUI"}, id="d1")]),
        text_reply("delegated"),
    )
    send(main, "delegate it")
    drive_until_idle(main)
    child_id = json.loads(_results(main)["d1"].content)["session_id"]
    model_server.script(
        "agent",
        tool_reply([tool_call("session_delegate", {"request": "Continue", "session_id": child_id}, id="d2")]),
        text_reply("sent the follow-up"),
    )
    send(main, "and continue")
    drive_until_idle(main)
    assert json.loads(_results(main)["d2"].content)["reused"] is True
    assert Session.objects.filter(parent=main).count() == 1
    assert Session.objects.get(pk=child_id).title == "ComfyUI"
    assert [i.payload["text"] for i in Input.objects.filter(session_id=child_id)] == [REQUEST, "Continue"]


@pytest.mark.parametrize(
    "arguments, code",
    [
        ({"request": REQUEST, "files": ["../../etc/passwd"]}, "path_escape"),
        ({"request": REQUEST, "files": ["missing.md"]}, "not_found"),
        ({"request": REQUEST, "session_id": "not-a-uuid"}, "not_found"),
    ],
)
def test_a_bad_delegation_is_a_tool_error_and_creates_nothing(main, model_server, arguments, code):
    model_server.script(
        "agent", tool_reply([tool_call("session_delegate", arguments, id="d1")]), text_reply("could not")
    )
    send(main, "delegate it")
    drive_until_idle(main)
    result = _results(main)["d1"]
    assert result.is_error
    assert not Session.objects.filter(parent=main).exists()
    assert main.status == "idle"
    assert code in result.content or code.replace("_", " ") in result.content


def test_another_mains_sub_session_cannot_be_reused(main, tenant_a, owner_a, model_server):
    other_main = new_session(tenant_a, owner_a, title="other")
    stranger = new_session(tenant_a, owner_a, title="not yours", kind="sub", parent=other_main)
    model_server.script(
        "agent",
        tool_reply(
            [tool_call("session_delegate", {"request": "x", "session_id": str(stranger.pk)}, id="d1")]
        ),
        text_reply("no"),
    )
    send(main, "delegate it")
    drive_until_idle(main)
    assert _results(main)["d1"].is_error
    assert not Input.objects.filter(session=stranger).exists()


def test_goals_are_edited_by_a_person_and_every_request_shows_them(
    tenant_a, owner_a, model_config_a, model_server, api_owner_a, api_outsider_b
):
    session = new_session(tenant_a, owner_a)
    model_server.script("agent", text_reply("one"), text_reply("two"))
    send(session, "Write the release notes")
    drive_until_idle(session)
    url = f"/api/v1/sessions/{session.pk}/"
    answer = api_owner_a.patch(
        url, {"session_goal": "Ship release 2.0", "phase_goal": "Draft the notes for 2.0"}, format="json"
    )
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["session_goal"], body["phase_goal"]) == ("Ship release 2.0", "Draft the notes for 2.0")
    (updated,) = [e.data for e in SessionEvent.objects.filter(session=session, type="goals.updated")]
    assert updated["by"] == owner_a.username
    send(session, "go on")
    drive_until_idle(session)
    system = model_server.requests_for("agent")[1].messages[0]["content"]
    assert (
        "Session goal: Ship release 2.0" in system and "Current phase goal: Draft the notes for 2.0" in system
    )
    # Bad input is a clear 400; another tenant sees nothing.
    too_long = api_owner_a.patch(url, {"phase_goal": "x" * 10001}, format="json")
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "validation_error"
    assert_cross_tenant_404(api_outsider_b, url, methods=("get", "patch"), hidden=["Ship release 2.0"])
    session.refresh_from_db()
    assert session.session_goal == "Ship release 2.0"


def test_the_session_page_api_links_parent_and_children(main, tenant_a, owner_a, api_owner_a):
    child = new_session(tenant_a, owner_a, title="part one", kind="sub", parent=main)
    parent_view = api_owner_a.get(f"/api/v1/sessions/{main.pk}/").json()
    assert parent_view["children"] == [{"id": str(child.pk), "title": "part one", "status": "idle"}]
    child_view = api_owner_a.get(f"/api/v1/sessions/{child.pk}/").json()
    assert child_view["parent"] == str(main.pk) and child_view["kind"] == "sub"
    assert {c["added_by"] for c in child_view["capability_sources"]} <= {"default"}


def test_a_colleagues_sub_session_is_not_reused_and_refused_files_leave_no_orphan(
    main, tenant_a, member_a, model_server, settings
):
    colleagues = new_session(tenant_a, member_a, title="member's", kind="sub", parent=main)
    settings.XAGENT_UPLOAD_MAX_BYTES = 10
    (engine.workspace_path(main) / "big.bin").write_bytes(b"x" * 11)
    model_server.script(
        "agent",
        tool_reply(
            [
                tool_call("session_delegate", {"request": "x", "session_id": str(colleagues.pk)}, id="d1"),
                tool_call("session_delegate", {"request": "x", "files": ["big.bin"]}, id="d2"),
            ]
        ),
        text_reply("no"),
    )
    send(main, "delegate it")
    drive_until_idle(main)
    results = _results(main)
    assert results["d1"].is_error and not Input.objects.filter(session=colleagues).exists()
    assert results["d2"].is_error and "limit" in results["d2"].content
    assert list(Session.objects.filter(parent=main).values_list("pk", flat=True)) == [colleagues.pk]


def test_handed_over_files_are_not_the_sub_sessions_delivery(main, model_server):
    model_server.script(
        "agent",
        tool_reply([tool_call("session_delegate", {"request": REQUEST, "files": ["notes.md"]}, id="d1")]),
        text_reply("delegated"),
        tool_reply([tool_call("fs_write", {"path": "report.md", "content": "# Report\n"}, id="w1")]),
        text_reply("report.md written"),
    )
    send(main, "delegate it")
    drive_until_idle(main)
    child = Session.objects.get(parent=main)
    (sent,) = Input.objects.filter(session=child)
    assert sent.created_by_id == main.owner_id  # the MainSession's owner asks
    drive_until_idle(child)
    delivery = child.deliveries.get()
    assert [f["path"] for f in delivery.files] == ["report.md"]
    (event,) = Input.objects.filter(session=main, kind="session_event")
    assert event.payload["files"] == [f"from-{str(child.pk)[:8]}/report.md"]


def test_goals_and_texts_must_be_strings(main, api_owner_a):
    url = f"/api/v1/sessions/{main.pk}/"
    for body in ({"phase_goal": 123}, {"session_goal": ["a"]}, {"phase_goal": None}, {"title": 1e300}):
        answer = api_owner_a.patch(url, body, format="json")
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "validation_error", body
    sent = api_owner_a.post(f"{url}inputs/", {"text": 123}, format="json")
    assert sent.status_code == 400
    assert not Input.objects.filter(session=main).exists()


def test_a_handed_over_message_names_the_main_session_that_sent_it(main, model_server, api_owner_a):
    model_server.script("task_relation", relation("new_task"), relation("continue_current"))
    model_server.script("agent", text_reply("on it"), text_reply("noted"))
    handed = engine.delegate(main.pk, request=REQUEST)
    child = Session.objects.get(pk=handed["session_id"])
    drive_until_idle(child)
    api_owner_a.post(f"/api/v1/sessions/{child.pk}/inputs/", {"text": "Also cover workflows."}, format="json")
    drive_until_idle(child)

    rows = api_owner_a.get(f"/api/v1/sessions/{child.pk}/messages/").json()["results"]

    users = [(m["content"], m["author"], m["delegated_by"]) for m in rows if m["role"] == "user"]
    assert users == [(REQUEST, "owner_a", str(main.pk)), ("Also cover workflows.", "owner_a", None)]
    assert {m["delegated_by"] for m in rows if m["role"] != "user"} == {None}
