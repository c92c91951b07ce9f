"""Issue #25, deliverable 5: a `{{secret:NAME}}` is resolved only in configuration an admin wrote
(a tool set's shell environment, MCP headers/env), never in arguments the model chose; what a
program given a secret prints is redacted in its plain and cheaply transformed forms.
(Issue #8, point 8, kept: tenants cannot create native tools that have no implementation.)

The end-to-end runs through the real agent loop are in tests/security/test_bound_secrets.py.
"""

from __future__ import annotations

import base64
import json

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils.html import escape

from sessions_app import artifacts
from tools_app.base import Tool, ToolContext, ToolResult
from tools_app.models import ToolSet
from tools_app.native.files import FsWrite
from tools_app.registry import NATIVE_TOOLS
from tools_app.secrets import (
    MASK,
    Redactor,
    StreamRedactor,
    bound_shell_environment,
    redact_byte_chunks,
    set_secret,
)
from tools_app.service import ToolService
from tools_app.workspace import workspace_for

SECRET = "tok-5ecret-value-42"


class Recording(Tool):
    """Records the arguments it ran with."""

    name = "recording"
    input_schema = {"type": "object"}

    def __init__(self):
        self.seen: list[dict] = []

    def run(self, ctx, args):
        self.seen.append(args)
        return ToolResult(content="ran")


class NoPort:
    def file_changed(self, path, op):
        pass


@pytest.fixture
def ctx(tmp_path):
    return ToolContext(session_id="s", tenant_id=1, workspace=workspace_for(tmp_path, 1, "s"), port=NoPort())


def run(tool, args, ctx, **service):
    return ToolService(**service).execute("c1", tool.name, json.dumps(args), ctx, {tool.name: tool})


def asks_a_person(tool, args, ctx):
    raise AssertionError("a call that cannot run must not reach the approval stage")


# --- the model's arguments never carry a secret --------------------------------------------------


def test_a_secret_in_file_contents_is_refused_before_approval_and_nothing_is_written(ctx):
    outcome = run(
        FsWrite(), {"path": "conf.txt", "content": "token={{secret:TOKEN}}"}, ctx, approval_hook=asks_a_person
    )

    assert not outcome.ok
    assert (outcome.stage, outcome.error_code) == ("inject_secrets", "secret_not_allowed")
    assert "$.content" in outcome.content
    assert "bound by admins" in outcome.content and "tool set's shell environment" in outcome.content
    assert not (ctx.workspace / "conf.txt").exists()


def test_shell_exec_env_from_the_model_takes_no_secret(ctx):
    shell = NATIVE_TOOLS["shell_exec"]
    outcome = run(
        shell,
        {"command": "echo $A", "env": {"A": "{{secret:TOKEN}}"}},
        ctx,
        approval_hook=asks_a_person,
    )
    assert (outcome.stage, outcome.error_code) == ("inject_secrets", "secret_not_allowed")
    assert "$.env.A" in outcome.content
    # What the model is told about env no longer invites a reference.
    assert "{{secret" not in json.dumps(shell.input_schema) and "{{secret" not in shell.description


def test_no_tool_resolves_a_reference_the_model_wrote(ctx):
    tool = Recording()
    for args, path in (
        ({"env": {"A": "{{secret:TOKEN}}"}}, "$.env.A"),
        ({"command": "echo {{secret:TOKEN}}"}, "$.command"),
        ({"options": [{"x": "{{ secret:TOKEN }}"}]}, "$.options[0].x"),
    ):
        outcome = run(tool, args, ctx)
        assert outcome.error_code == "secret_not_allowed" and path in outcome.content
    assert tool.seen == []
    assert not any(hasattr(t, "secret_fields") for t in NATIVE_TOOLS.values())


def test_whether_a_secret_exists_is_not_told_to_the_model(ctx):
    """Known or not, the answer is the same refusal: the model cannot probe secret names."""
    unknown = run(FsWrite(), {"path": "x", "content": "{{secret:NOPE}}"}, ctx)
    known = run(FsWrite(), {"path": "x", "content": "{{secret:TOKEN}}"}, ctx)
    assert unknown.error_code == known.error_code == "secret_not_allowed"
    assert unknown.content.replace("NOPE", "TOKEN") == known.content


# --- what admins bound: ToolContext.env ----------------------------------------------------------


def test_shell_exec_refuses_to_run_without_a_secret_its_tool_set_names(ctx):
    ctx.env_problem = "the tool set 'deploy' binds TOKEN to the secret 'NOPE', which this tenant has not set"
    outcome = run(NATIVE_TOOLS["shell_exec"], {"command": "true"}, ctx, approval_hook=asks_a_person)
    assert (outcome.stage, outcome.error_code) == ("precheck", "missing_secret")
    assert "'deploy'" in outcome.content and "NOPE" in outcome.content


def test_the_model_cannot_override_a_variable_an_admin_bound(ctx):
    ctx.env = {"TOKEN": SECRET}
    outcome = run(
        NATIVE_TOOLS["shell_exec"],
        {"command": "true", "env": {"TOKEN": "mine", "PLAIN": "ok"}},
        ctx,
        approval_hook=asks_a_person,
    )
    assert (outcome.stage, outcome.error_code) == ("precheck", "env_bound_by_admin")
    assert "TOKEN" in outcome.content and "PLAIN" not in outcome.content and SECRET not in outcome.content


@pytest.mark.django_db
def test_a_sessions_tool_sets_bind_its_shell_environment(tenant_a, tenant_b):
    ToolSet.objects.create(tenant=None, name="shared", shell_env={"REGION": "eu", "MODE": "global"})
    ToolSet.objects.create(tenant=tenant_a, name="shared", shell_env={"MODE": "tenant"})
    ToolSet.objects.create(tenant=tenant_a, name="deploy", shell_env={"TOKEN": "Bearer {{secret:DEPLOY}}"})
    ToolSet.objects.create(tenant=tenant_a, name="broken", shell_env={"X": "{{secret:NOPE}}"})
    ToolSet.objects.create(tenant=tenant_b, name="bravo", shell_env={"B": "from bravo"})
    secrets = {"DEPLOY": SECRET}

    bound = bound_shell_environment(tenant_a.pk, ["shared", "deploy", "bravo"], secrets)
    assert bound.problem == ""
    # The tenant's row wins over the global one of the same name; another tenant's is not there.
    assert bound.env == {"REGION": "eu", "MODE": "tenant", "TOKEN": f"Bearer {SECRET}"}

    broken = bound_shell_environment(tenant_a.pk, ["deploy", "broken"], secrets)
    assert broken.env == {} and "'broken'" in broken.problem and "'NOPE'" in broken.problem
    assert bound_shell_environment(tenant_a.pk, [], secrets).env == {}


@pytest.mark.django_db
def test_a_tool_sets_shell_environment_is_validated(tenant_a):
    with pytest.raises(ValidationError, match="not a valid environment variable name"):
        ToolSet(tenant=tenant_a, name="bad", shell_env={"BAD-NAME": "x"}).full_clean()
    with pytest.raises(ValidationError, match="must be a string"):
        ToolSet(tenant=tenant_a, name="bad", shell_env={"N": 1}).full_clean()


@pytest.mark.django_db
def test_the_admin_shows_the_shell_environment_and_warns_of_a_missing_secret(owner_a, tenant_a):
    set_secret(tenant_a, "DEPLOY", SECRET)
    client = Client()
    client.force_login(owner_a)
    form = client.get("/admin/tools_app/toolset/add/").content.decode()
    assert 'name="shell_env"' in form and "the model can never reference one" in form

    response = client.post(
        "/admin/tools_app/toolset/add/",
        {
            "tenant": tenant_a.pk,
            "name": "deploy",
            "description": "",
            "shell_env": json.dumps({"TOKEN": "{{secret:DEPLOY}}", "OTHER": "{{secret:NOPE}}"}),
        },
        follow=True,
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "references secrets this tenant has not set (NOPE)" in page
    assert SECRET not in page
    assert ToolSet.objects.get(tenant=tenant_a, name="deploy").shell_env["TOKEN"] == "{{secret:DEPLOY}}"


# --- redaction of what a program printed --------------------------------------------------------


def test_the_redactor_masks_hex_reversed_and_spaced_forms():
    redactor = Redactor([SECRET])
    raw = SECRET.encode()
    for form in (
        SECRET,
        raw.hex(),
        raw.hex().upper(),
        SECRET[::-1],
        " ".join(SECRET),
        base64.b64encode(raw).decode(),
    ):
        assert redactor.redact(f"<{form}>") == f"<{MASK}>", form
    # Too short to mask safely: left alone, in every form.
    assert not Redactor(["abc"]) and Redactor(["abc"]).redact("abc cba 616263") == "abc cba 616263"

    stream = StreamRedactor(redactor)
    hexed = raw.hex()
    out = "".join(stream.feed(c) for c in ("x", hexed[:7], hexed[7:20], hexed[20:] + "y")) + stream.flush()
    assert out == f"x{MASK}y"


def test_file_bytes_are_redacted_across_chunks_and_other_bytes_pass_unchanged():
    redactor = Redactor([SECRET])
    data = (
        b"\xff\xfe binary \xe2\x82 head " + SECRET.encode() + " caf\u00e9 ".encode() + SECRET[::-1].encode()
    )
    for size in (1, 3, 7, 64):
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        out = b"".join(redact_byte_chunks(chunks, redactor))
        assert (
            out == b"\xff\xfe binary \xe2\x82 head " + MASK.encode() + " caf\u00e9 ".encode() + MASK.encode()
        )
    plain = b"no secrets here \x00\x01\xff"
    assert b"".join(redact_byte_chunks([plain[:5], plain[5:]], redactor)) == plain


def test_file_checks_and_previews_mask_a_secret_before_cutting_and_after_parsing(tmp_path):
    redactor = Redactor([SECRET])
    csv_path = tmp_path / "s.csv"
    long_cell = "x" * (artifacts.MAX_CELL_CHARS - 5) + SECRET  # the cut would keep half the value
    csv_path.write_text(f"name,{SECRET}\nalpha,{SECRET}\nbeta,{long_cell}\n")
    html_path = tmp_path / "s.html"
    entity = "".join(f"&#{ord(c)};" for c in SECRET)  # the raw bytes do not spell it; the parser does
    html_path.write_text(f"<html><head><title>{entity}</title></head><body><h1>{SECRET}</h1>x</body></html>")

    for path in (csv_path, html_path):
        check = artifacts.check_file(path, path.name, redactor)
        shown = json.dumps(check.as_dict())
        assert SECRET not in shown and SECRET[:8] not in shown and MASK in shown, shown
        preview = json.dumps(artifacts.preview(path, path.name, "/raw", redactor))
        assert SECRET[:8] not in preview
    assert artifacts.check_file(html_path, "s.html", redactor).facts["title"] == MASK
    assert artifacts.preview(csv_path, "s.csv", "/raw", redactor)["rows"][0] == ["alpha", MASK]
    # Without secrets nothing changes.
    assert artifacts.check_file(csv_path, "s.csv").facts["sample_rows"][0] == ["alpha", SECRET]


# --- native tools come with the product ------------------------------------------------------


@pytest.mark.django_db
def test_a_tenant_admin_cannot_create_a_native_tool_without_an_implementation(owner_a, tenant_a):
    from tools_app.models import Tool as ToolRow

    client = Client()
    client.force_login(owner_a)
    response = client.post(
        "/admin/tools_app/tool/add/",
        {
            "tenant": tenant_a.pk,
            "name": "phantom_tool",
            "description": "does anything",
            "input_schema": "{}",
            "risk": "read",
            "read_only": "on",
            "enabled": "on",
        },
    )
    assert response.status_code == 200
    assert escape("There is no native tool named 'phantom_tool'") in response.content.decode()
    assert not ToolRow.objects.filter(name="phantom_tool").exists()

    with pytest.raises(ValidationError, match="no native tool"):
        ToolRow(tenant=tenant_a, name="phantom_tool", input_schema={"type": "object"}).full_clean()
    # A tenant row for a real native tool (to re-risk it for the tenant) is still fine.
    ToolRow(
        tenant=tenant_a, name="fs_write", input_schema={"type": "object"}, risk="destructive"
    ).full_clean()
