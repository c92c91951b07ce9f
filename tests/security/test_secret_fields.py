"""Issue #8, point 8: a `{{secret:NAME}}` reference is resolved only in fields a tool declares
secret-capable (shell_exec's env; MCP headers/env are server settings), never in file contents
or other arguments; and tenants cannot create native tools that have no implementation.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils.html import escape

from tools_app.base import Tool, ToolContext, ToolResult
from tools_app.native.files import FsWrite
from tools_app.registry import NATIVE_TOOLS
from tools_app.service import ToolService
from tools_app.workspace import workspace_for

SECRET = "tok-5ecret-value-42"


class Recording(Tool):
    """A tool with one secret-capable field, recording the arguments it ran with."""

    name = "recording"
    input_schema = {"type": "object"}
    secret_fields = ("env",)

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
    return ToolContext(
        session_id="s",
        tenant_id=1,
        workspace=workspace_for(tmp_path, 1, "s"),
        port=NoPort(),
        secrets={"TOKEN": SECRET},
    )


def run(tool, args, ctx):
    import json

    return ToolService().execute("c1", tool.name, json.dumps(args), ctx, {tool.name: tool})


def test_a_secret_in_file_contents_is_a_tool_error_and_nothing_is_written(ctx):
    outcome = run(FsWrite(), {"path": "conf.txt", "content": "token={{secret:TOKEN}}"}, ctx)

    assert not outcome.ok
    assert (outcome.stage, outcome.error_code) == ("inject_secrets", "secret_not_allowed")
    assert "$.content" in outcome.content and "secret-capable" in outcome.content
    assert SECRET not in outcome.content
    assert not (ctx.workspace / "conf.txt").exists()


def test_a_secret_is_injected_only_in_secret_capable_fields(ctx):
    tool = Recording()
    outcome = run(tool, {"env": {"A": "{{secret:TOKEN}}"}, "note": "plain"}, ctx)
    assert outcome.ok
    assert tool.seen == [{"env": {"A": SECRET}, "note": "plain"}]
    assert SECRET not in str(outcome.arguments)  # evidence keeps the reference

    refused = run(tool, {"env": {}, "command": "echo {{secret:TOKEN}}"}, ctx)
    assert (refused.stage, refused.error_code) == ("inject_secrets", "secret_not_allowed")
    assert "$.command" in refused.content
    nested = run(tool, {"options": [{"x": "{{ secret:TOKEN }}"}]}, ctx)
    assert nested.error_code == "secret_not_allowed" and "$.options[0].x" in nested.content
    assert len(tool.seen) == 1  # neither refused call ran


def test_shell_exec_takes_secrets_in_env_but_not_in_its_command(ctx):
    shell = NATIVE_TOOLS["shell_exec"]
    assert shell.secret_fields == ("env",)
    outcome = run(shell, {"command": "echo {{secret:TOKEN}}"}, ctx)
    assert (outcome.stage, outcome.error_code) == ("inject_secrets", "secret_not_allowed")


def test_a_tool_without_secret_fields_takes_no_secrets(ctx):
    class Plain(Recording):
        name = "plain"
        secret_fields = ()

    tool = Plain()
    outcome = run(tool, {"q": "{{secret:TOKEN}}"}, ctx)
    assert outcome.error_code == "secret_not_allowed" and "takes no secrets" in outcome.content
    assert tool.seen == []


def test_an_unknown_secret_is_still_named_as_missing(ctx):
    outcome = run(FsWrite(), {"path": "x", "content": "{{secret:NOPE}}"}, ctx)
    assert (outcome.stage, outcome.error_code) == ("inject_secrets", "missing_secret")
    assert "NOPE" in outcome.content


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
