"""Tool governance on the real loop: secret injection + redaction, on-demand discovery,
disabled tools, and tenant boundaries. The model is the scripted server only."""

import base64
import json

import pytest

from sessions_app.models import Message, ModelCall, SessionCapability, SessionEvent, Turn
from sessions_app.runtime import engine
from tests.runtime.helpers import assert_tool_pairs, drive_until_idle, event_types, new_session, send
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.models import Tool, ToolSet
from tools_app.secrets import MASK, Redactor, StreamRedactor, set_secret

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "tok-9f8e7d6c5b4a"


@pytest.fixture
def session(tenant_a, owner_a, model_config_a):
    return new_session(tenant_a, owner_a)


def _every_stored_text(session) -> str:
    rows = [
        *Message.objects.filter(session=session).values_list("content", "tool_calls"),
        *SessionEvent.objects.filter(session=session).values_list("type", "data"),
        *ModelCall.objects.filter(session=session).values_list("attempt_errors", "error"),
    ]
    return json.dumps(rows, default=str)


def test_redactor_masks_plain_base64_url_encoded_and_split_values():
    redactor = Redactor([SECRET, "a b&c=d/e"])
    text = f"x {SECRET} y {base64.b64encode(SECRET.encode()).decode()} z a%20b%26c%3Dd%2Fe w a+b%26c%3Dd%2Fe"
    masked = redactor.redact(text)
    assert SECRET not in masked and "a%20b%26c" not in masked and masked.count(MASK) == 4

    stream = StreamRedactor(Redactor([SECRET]))
    chunks = ["the token is tok-9f8", "e7d6c5b", "4a, done"]
    out = "".join(stream.feed(c) for c in chunks) + stream.flush()
    assert out == f"the token is {MASK}, done"


def test_secrets_are_injected_at_execution_and_redacted_everywhere(session, tenant_a, model_server):
    # Only what an admin wrote binds a secret (a tool set's shell environment); the model uses the
    # variable by name.
    set_secret(tenant_a, "API_TOKEN", SECRET)
    ToolSet.objects.create(tenant=tenant_a, name="configure", shell_env={"TOKEN": "{{secret:API_TOKEN}}"})
    engine.add_selected_capabilities(
        session.pk, None, tools=["shell_exec"], toolsets=["configure"], added_by="test"
    )
    model_server.script(
        "agent",
        tool_reply([tool_call("shell_exec", {"command": 'printf "token=%s" "$TOKEN" > conf.txt'}, id="w")]),
        tool_reply([tool_call("fs_read", {"path": "conf.txt"}, id="r")]),
        text_reply("configured"),
    )
    send(session, "configure the token")
    drive_until_idle(session)
    from approvals_app.models import PendingApproval
    from sessions_app.runtime import brain

    brain.submit_decision(PendingApproval.objects.get(session_id=session.pk), "approve", user=session.owner)
    drive_until_idle(session)

    # The tool really received the value...
    assert (engine.workspace_path(session) / "conf.txt").read_text() == f"token={SECRET}"
    # ...but no stored row, event, evidence or later model request contains it.
    read_back = Message.objects.get(session=session, tool_call_id="r").content
    assert MASK in read_back
    assert SECRET not in _every_stored_text(session)
    assert all(SECRET not in json.dumps(r.body) for r in model_server.requests_for("agent"))
    assert Turn.objects.filter(session=session).last().reason == "completed"


def test_an_unknown_secret_reference_is_a_clear_tool_error(session, model_server):
    model_server.script(
        "agent",
        tool_reply([tool_call("fs_write", {"path": "x.txt", "content": "{{secret:NOPE}}"}, id="w")]),
        text_reply("ok"),
    )
    send(session, "write")
    drive_until_idle(session)
    result = Message.objects.get(session=session, tool_call_id="w")
    assert result.is_error and "inject_secrets (secret_not_allowed)" in result.content
    assert "NOPE" in result.content
    assert not (engine.workspace_path(session) / "x.txt").exists()


def test_tools_are_found_then_selected_before_they_can_be_called(session, tenant_a, model_server):
    toolset = ToolSet.objects.create(
        tenant=tenant_a, name="file-cleanup", description="Delete files you no longer need"
    )
    toolset.tools.add(Tool.objects.get(tenant=None, name="fs_delete_files"))
    (engine.workspace_path(session) / "old.txt").write_text("old")
    model_server.script(
        "agent",
        tool_reply([tool_call("fs_delete_files", {"paths": ["old.txt"]}, id="early")]),
        tool_reply([tool_call("tools_find", {"query": "delete files"}, id="find")]),
        tool_reply([tool_call("tools_select", {"names": ["file-cleanup"]}, id="select")]),
        tool_reply([tool_call("fs_delete_files", {"paths": ["old.txt"]}, id="late")]),
        text_reply("cleaned up"),
    )
    send(session, "delete old.txt")
    drive_until_idle(session)
    # Selected, the destructive delete is now callable, and the default policy asks a person first.
    assert session.status == "waiting_approval"
    from approvals_app.models import PendingApproval
    from sessions_app.runtime import brain

    brain.submit_decision(PendingApproval.objects.get(session_id=session.pk), "approve", user=session.owner)
    drive_until_idle(session)

    results = {m.tool_call_id: m for m in Message.objects.filter(session=session, role="tool")}
    assert results["early"].is_error and "not available in this session" in results["early"].content
    found = json.loads(results["find"].content)
    assert {"kind": "toolset", "name": "file-cleanup"}.items() <= found[0].items()
    assert not results["select"].is_error
    assert not results["late"].is_error and not (engine.workspace_path(session) / "old.txt").exists()
    assert list(
        SessionCapability.objects.filter(session=session).values_list("kind", "name", "added_by")
    ) == [("toolset", "file-cleanup", "model")]
    added = [e.data for e in SessionEvent.objects.filter(session=session, type="capabilities.added")]
    assert [{k: v for k, v in a.items() if k != "after_message_id"} for a in added] == [
        {"skills": [], "tools": [], "toolsets": ["file-cleanup"]}
    ]
    assert_tool_pairs(session)


def test_a_disabled_tool_is_refused_with_its_own_error(session, model_server):
    Tool.objects.filter(tenant=None, name="fs_edit").update(enabled=False)
    model_server.script(
        "agent",
        tool_reply([tool_call("fs_edit", {"path": "a", "old_text": "x", "new_text": "y"}, id="e")]),
        text_reply("ok"),
    )
    send(session, "edit")
    drive_until_idle(session)
    result = Message.objects.get(session=session, tool_call_id="e")
    assert result.is_error and "tool_disabled" in result.content


def test_another_tenants_tools_and_secrets_are_out_of_reach(session, tenant_b, model_server):
    foreign = ToolSet.objects.create(tenant=tenant_b, name="bravo-only", description="secret bravo cleanup")
    foreign.tools.add(Tool.objects.get(tenant=None, name="fs_delete_files"))
    set_secret(tenant_b, "BRAVO_TOKEN", "bravo-secret-value")
    model_server.script(
        "agent",
        tool_reply([tool_call("tools_find", {"query": "bravo cleanup"}, id="find")]),
        tool_reply([tool_call("tools_select", {"names": ["bravo-only"]}, id="select")]),
        tool_reply(
            [tool_call("fs_write", {"path": "t.txt", "content": "{{secret:BRAVO_TOKEN}}"}, id="steal")]
        ),
        text_reply("nothing to see"),
    )
    send(session, "look around")
    drive_until_idle(session)

    results = {m.tool_call_id: m for m in Message.objects.filter(session=session, role="tool")}
    assert "bravo-only" not in results["find"].content
    assert results["select"].is_error and "Unknown or disabled: bravo-only" in results["select"].content
    # Refused as any reference the model writes is, whoever's secret it names.
    assert results["steal"].is_error and "secret_not_allowed" in results["steal"].content
    assert not SessionCapability.objects.filter(session=session).exists()
    assert "capabilities.added" not in event_types(session)
