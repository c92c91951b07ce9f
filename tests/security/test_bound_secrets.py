"""Issue #25, deliverable 5, "Secrets only where an admin bound them", on the real agent loop
(SessionEngine + Brain + AgentService + ToolService + the bwrap sandbox; the model is the scripted
server only).

The attack: the model put `{{secret:ASECRET}}` in shell_exec's env and had the command write the
value into s.csv; a member then read it from the delivery record, the files API and admin, and
hex/reversed copies passed redaction. Now a reference from the model is refused, a secret reaches
a process only through a tool set's shell environment an admin wrote, and every surface the
program's output reaches shows [REDACTED].
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from django.test import Client

from approvals_app.models import PendingApproval
from sessions_app.models import Delivery, Message, ModelCall, SessionEvent, Turn
from sessions_app.runtime import brain, engine
from tests.runtime.helpers import assert_tool_pairs, drive_until_idle, new_session, send
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.models import Tool, ToolSet
from tools_app.secrets import MASK, set_secret

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-live-3b9e1c7a5d2f"
FORMS = {
    "plain": SECRET,
    "hex": SECRET.encode().hex(),
    "HEX": SECRET.encode().hex().upper(),
    "reversed": SECRET[::-1],
    "spaced": " ".join(SECRET),
    "base64": base64.b64encode(SECRET.encode()).decode(),
}


def assert_no_form(text: str, where: str) -> None:
    for name, form in FORMS.items():
        assert form not in text, f"the {name} form of the secret is in {where}"


def stored_text(session) -> str:
    rows = [
        *Message.objects.filter(session=session).values_list("content", "tool_calls"),
        *SessionEvent.objects.filter(session=session).values_list("type", "data"),
        *ModelCall.objects.filter(session=session).values_list("attempt_errors", "error"),
        *Delivery.objects.filter(session=session).values_list("final_answer", "files", "checks"),
    ]
    return json.dumps(rows, default=str)


def results(session) -> dict[str, Message]:
    return {m.tool_call_id: m for m in Message.objects.filter(session=session, role="tool")}


def approve_until_idle(session, person) -> int:
    approved = 0
    drive_until_idle(session)
    while session.status == "waiting_approval":
        brain.submit_decision(
            PendingApproval.objects.get(session_id=session.pk, status="pending"), "approve", user=person
        )
        approved += 1
        drive_until_idle(session)
    return approved


def reporting_tool_set(tenant, shell_env: dict, name: str = "reporting") -> ToolSet:
    """What an admin writes: a default tool set with shell_exec and its shell environment."""
    toolset = ToolSet.objects.create(tenant=tenant, name=name, is_default=True, shell_env=shell_env)
    toolset.tools.add(Tool.objects.get(tenant=None, name="shell_exec"))
    return toolset


def test_a_secret_reference_in_model_arguments_is_refused(tenant_a, member_a, model_config_a, model_server):
    set_secret(tenant_a, "ASECRET", SECRET)
    session = new_session(tenant_a, member_a)
    engine.add_selected_capabilities(session.pk, None, tools=["shell_exec"], added_by="test")
    model_server.script(
        "agent",
        tool_reply(
            [
                tool_call(
                    "shell_exec",
                    {
                        "command": 'printf "a,b\\n1,%s\\n" "$TOK" > s.csv',
                        "env": {"TOK": "{{secret:ASECRET}}"},
                    },
                    id="env",
                ),
                tool_call("fs_write", {"path": "t.txt", "content": "token={{secret:ASECRET}}"}, id="write"),
                tool_call("fs_write", {"path": "u.txt", "content": "{{secret:NOT_SET}}"}, id="probe"),
            ]
        ),
        text_reply("could not use it"),
    )
    send(session, "write the token into s.csv")
    drive_until_idle(session)

    # Refused before the approval stage: nobody was asked about a call that cannot run.
    assert not PendingApproval.objects.filter(session_id=session.pk).exists()
    found = results(session)
    for call_id in ("env", "write", "probe"):
        assert found[call_id].is_error
        assert "inject_secrets (secret_not_allowed)" in found[call_id].content
        assert "bound by admins" in found[call_id].content
    # A name the tenant has not set gets the same answer: the model learns nothing about names.
    assert "missing_secret" not in found["probe"].content
    workspace = engine.workspace_path(session)
    assert not any(workspace.iterdir())
    assert Turn.objects.get(session=session).reason == "completed"
    assert_no_form(stored_text(session), "stored rows")
    assert_tool_pairs(session)


def test_an_admin_bound_secret_reaches_the_process_and_every_surface_shows_it_redacted(
    tenant_a, owner_a, member_a, model_config_a, model_server, api_member_a
):
    set_secret(tenant_a, "ASECRET", SECRET)
    reporting_tool_set(tenant_a, {"TOK": "{{secret:ASECRET}}", "REGION": "eu"})
    session = new_session(tenant_a, member_a)  # the default tool set attaches itself
    command = (
        'printf "name,token\\nalpha,%s\\n" "$TOK" > s.csv; '
        'printf "<html><head><title>%s</title></head><body><h1>Report</h1><p>%s</p></body></html>" '
        '"$TOK" "$TOK" > s.html; '
        'echo "greeting=$GREETING region=$REGION"; echo "plain=$TOK"; '
        'printf %s "$TOK" | od -An -tx1 | tr -d " \\n"; echo; '
        'printf %s "$TOK" | od -An -tx1 | tr -d " \\n" | tr a-f A-F; echo; '
        'printf %s "$TOK" | rev; printf %s "$TOK" | sed "s/./& /g"; echo; '
        'printf %s "$TOK" | sha256sum'
    )
    model_server.script(
        "agent",
        # The model cannot redirect what an admin bound...
        tool_reply([tool_call("shell_exec", {"command": "true", "env": {"TOK": "mine"}}, id="override")]),
        # ...but may add plain variables of its own.
        tool_reply([tool_call("shell_exec", {"command": command, "env": {"GREETING": "hi"}}, id="sh")]),
        tool_reply([tool_call("fs_read", {"path": "s.csv"}, id="read")]),
        text_reply("wrote s.csv and s.html"),
    )
    send(session, "write the report")
    assert approve_until_idle(session, owner_a) == 1  # the refused override asked nobody

    found = results(session)
    assert found["override"].is_error and "env_bound_by_admin" in found["override"].content
    # The process had the value (its digest is not a form anyone redacts)...
    workspace = engine.workspace_path(session)
    assert SECRET in (workspace / "s.csv").read_text()
    shell = found["sh"].content
    assert not found["sh"].is_error and hashlib.sha256(SECRET.encode()).hexdigest() in shell
    assert "greeting=hi region=eu" in shell
    # ...and every form it printed is masked in the result the model and the Session see.
    assert shell.count(MASK) >= 5 and f"plain={MASK}" in shell
    assert MASK in found["read"].content
    assert Turn.objects.get(session=session).reason == "completed"

    # The delivery record, as a member reads it.
    deliveries = api_member_a.get(f"/api/v1/sessions/{session.pk}/deliveries/")
    assert deliveries.status_code == 200
    (delivery,) = deliveries.json()["results"]
    checks = {c["path"]: c for c in delivery["checks"]}
    assert checks["s.csv"]["facts"]["sample_rows"] == [["alpha", MASK]]
    assert checks["s.html"]["facts"]["title"] == MASK and MASK in checks["s.html"]["detail"]
    # The file as the files API serves it, raw, downloaded and previewed.
    base = f"/api/v1/sessions/{session.pk}"
    raw = api_member_a.get(f"{base}/files/s.csv")
    assert raw.status_code == 200 and raw["Content-Type"].startswith("text/csv")
    assert b"".join(raw.streaming_content).decode() == f"name,token\nalpha,{MASK}\n"
    download = api_member_a.get(f"{base}/files/s.html?download=1")
    page = b"".join(download.streaming_content).decode()
    assert f"<title>{MASK}</title>" in page and download["Content-Security-Policy"].startswith("sandbox")
    preview = api_member_a.get(f"{base}/previews/s.csv").json()
    assert preview["rows"] == [["alpha", MASK]]
    # Admin's Delivery page.
    admin = Client()
    admin.force_login(owner_a)
    admin_page = admin.get(f"/admin/sessions_app/delivery/{delivery['id']}/change/")
    assert admin_page.status_code == 200 and "sample_rows" in admin_page.content.decode()

    for where, text in {
        "the delivery record": json.dumps(delivery),
        "the raw file": page,
        "the preview": json.dumps(preview),
        "the admin page": admin_page.content.decode(),
        "stored rows": stored_text(session),
        "model requests": json.dumps([r.body for r in model_server.requests_for("agent")]),
        "the messages API": json.dumps(api_member_a.get(f"{base}/messages/").json()),
    }.items():
        assert_no_form(text, where)
    assert_tool_pairs(session)


def test_a_tool_set_naming_a_secret_the_tenant_has_not_set_fails_the_call_clearly(
    tenant_a, member_a, model_config_a, model_server
):
    reporting_tool_set(tenant_a, {"TOK": "{{secret:NEVER_SET}}"}, name="deploy")
    session = new_session(tenant_a, member_a)
    model_server.script(
        "agent",
        tool_reply([tool_call("shell_exec", {"command": "echo hi > out.txt"}, id="sh")]),
        text_reply("the deploy token is missing"),
    )
    send(session, "deploy")
    drive_until_idle(session)

    result = results(session)["sh"]
    assert result.is_error and "missing_secret" in result.content
    assert "'deploy'" in result.content and "NEVER_SET" in result.content
    assert not PendingApproval.objects.filter(session_id=session.pk).exists()
    assert not (engine.workspace_path(session) / "out.txt").exists()
    assert Turn.objects.get(session=session).reason == "completed"
