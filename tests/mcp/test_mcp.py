"""MCP support end to end against the shipped example server, over stdio and Streamable HTTP.

Only loopback: the HTTP server runs as a real process on 127.0.0.1; stdio servers are child
processes the client starts and stops itself.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from approvals_app.choices import Risk, ToolSource
from tests.factories import example_stdio_fields
from tests.integration.processes import PROJECT_ROOT, free_port, running
from tools_app.base import ToolContext, ToolError
from tools_app.mcp.client import MCPError
from tools_app.mcp.stdio import sandbox_python
from tools_app.mcp.sync import add_server, refresh_server
from tools_app.mcp.tool import MCPTool
from tools_app.models import MCPServer, Readiness, Tool
from tools_app.secrets import set_secret
from tools_app.service import ToolService

EXAMPLE = [sys.executable, "-m", "tools_app.mcp.example_server"]
EXAMPLE_TOOLS = [
    "add",
    "ask_preference",
    "echo",
    "fail",
    "pause",
    "pause_and_write",
    "save_note",
    "show_auth",
    "word_count",
]
SECRET = "s3cr3t-value"


def wait_until_accepting(port: int, proc: subprocess.Popen, log_path, deadline_s: float = 30) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"example server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"example server never accepted on port {port}:\n{log_path.read_text()}")


@pytest.fixture(scope="module")
def example_url(tmp_path_factory):
    """The example server over Streamable HTTP on a free loopback port, for this module."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("mcp") / "example_server.log"
    with running(
        [*EXAMPLE, "--http", "--host", "127.0.0.1", "--port", str(port)], dict(os.environ), log_path
    ) as proc:
        wait_until_accepting(port, proc, log_path)
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture
def dead_url():
    """A loopback URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}/mcp"


@pytest.fixture
def stdio_server(tenant_a):
    return add_server(tenant_a, "example", MCPServer.Transport.STDIO, **example_stdio_fields())


@pytest.fixture
def http_server(tenant_a, example_url):
    return add_server(tenant_a, "example", MCPServer.Transport.STREAMABLE_HTTP, url=example_url)


@pytest.fixture(params=["stdio", "http"])
def server(request):
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture
def ctx_a(tenant_a, tmp_path):
    return ToolContext(session_id="session-1", tenant_id=tenant_a.pk, workspace=tmp_path, port=None)


def mcp_tool(name: str) -> MCPTool:
    return MCPTool.from_row(Tool.objects.select_related("mcp_server").get(name=name))


def run_command(*args) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


# --- refresh --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_refresh_lists_the_tools_with_hint_derived_risk(server, tenant_a):
    result = refresh_server(server)

    names = sorted(f"example__{remote}" for remote in EXAMPLE_TOOLS)
    assert sorted(result.added) == names
    assert result.updated == [] and result.removed == []
    rows = {row.remote_name: row for row in Tool.objects.for_tenant(tenant_a).filter(mcp_server=server)}
    assert sorted(rows) == EXAMPLE_TOOLS
    assert all(r.source == ToolSource.MCP and r.tenant_id == tenant_a.pk for r in rows.values())
    assert all(r.readiness == Readiness.READY for r in rows.values())
    echo, add, save_note = rows["echo"], rows["add"], rows["save_note"]
    assert (echo.risk, echo.read_only, echo.idempotent) == (Risk.READ, True, False)
    assert (add.risk, add.read_only, add.idempotent) == (Risk.READ, True, True)
    assert (save_note.risk, save_note.read_only) == (Risk.WRITE, False)
    assert add.declared_hints == {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False}
    assert add.input_schema["required"] == ["a", "b"]
    assert add.description == "Add two numbers."
    server.refresh_from_db()
    assert server.status == MCPServer.Status.OK
    assert server.last_error == ""
    assert server.last_refreshed_at is not None


@pytest.mark.django_db
def test_refreshed_tools_belong_to_their_tenant_only(http_server, tenant_a, tenant_b):
    refresh_server(http_server)

    assert Tool.objects.for_tenant(tenant_a).filter(source=ToolSource.MCP).count() == len(EXAMPLE_TOOLS)
    assert not Tool.objects.for_tenant(tenant_b).filter(source=ToolSource.MCP).exists()


@pytest.mark.django_db
def test_a_second_refresh_keeps_what_an_admin_tightened(http_server):
    refresh_server(http_server)
    Tool.objects.filter(name="example__echo").update(risk=Risk.DESTRUCTIVE, read_only=False)
    Tool.objects.filter(name="example__save_note").update(risk=Risk.EXTERNAL, description="edited")

    result = refresh_server(http_server)

    assert result.added == [] and result.removed == []
    assert result.updated == ["example__save_note"]  # the server's description wins back
    echo = Tool.objects.get(name="example__echo")
    assert (echo.risk, echo.read_only) == (Risk.DESTRUCTIVE, False)
    assert echo.declared_hints["readOnlyHint"] is True  # what the server says stays visible
    save_note = Tool.objects.get(name="example__save_note")
    assert save_note.risk == Risk.EXTERNAL
    assert save_note.description.startswith("Save a note")


@pytest.mark.django_db
def test_a_tool_no_longer_listed_becomes_unavailable(http_server, tenant_a):
    refresh_server(http_server)
    Tool.objects.create(
        tenant=tenant_a,
        name="example__retired",
        source=ToolSource.MCP,
        mcp_server=http_server,
        remote_name="retired",
        risk=Risk.WRITE,
    )

    result = refresh_server(http_server)

    assert result.removed == ["example__retired"]
    retired = Tool.objects.get(name="example__retired")
    assert retired.readiness == Readiness.UNAVAILABLE
    assert "No longer listed by MCP server 'example'" in retired.readiness_reason
    assert Tool.objects.get(name="example__add").readiness == Readiness.READY


# --- calling tools --------------------------------------------------------------------------


@pytest.mark.django_db
def test_mcp_tool_calls_the_remote_tool(server, ctx_a):
    refresh_server(server)
    tool = mcp_tool("example__add")

    result = tool.run(ctx_a, {"a": 1, "b": 2})

    assert result.content == "3"
    assert not result.is_error
    assert result.data == {"server": "example", "tool": "add"}
    assert "example:add" in result.summary
    assert (tool.name, tool.risk, tool.read_only, tool.idempotent) == ("example__add", "read", True, True)
    assert tool.input_schema["required"] == ["a", "b"]


@pytest.mark.django_db
def test_a_remote_error_result_is_an_error_result(http_server, ctx_a):
    refresh_server(http_server)

    result = mcp_tool("example__fail").run(ctx_a, {"message": "disk full"})

    assert result.is_error
    assert "disk full" in result.content
    assert result.data == {"server": "example", "tool": "fail"}


@pytest.mark.django_db
def test_tool_service_runs_an_mcp_tool_through_every_stage(http_server, ctx_a):
    refresh_server(http_server)
    tool = mcp_tool("example__word_count")
    service = ToolService(known_tools={})

    outcome = service.execute("call-1", tool.name, '{"text": "one two three"}', ctx_a, {tool.name: tool})
    refused = service.execute("call-2", tool.name, '{"words": 3}', ctx_a, {tool.name: tool})

    assert outcome.ok and outcome.content == "3"
    assert outcome.data == {"server": "example", "tool": "word_count"}
    assert not refused.ok and refused.stage == "validate"  # the server's schema is enforced before the call


@pytest.mark.django_db
def test_a_tool_of_another_tenants_server_does_not_run(http_server, tenant_b, tmp_path):
    refresh_server(http_server)
    ctx_b = ToolContext(session_id="session-b", tenant_id=tenant_b.pk, workspace=tmp_path, port=None)

    with pytest.raises(ToolError) as refused:
        mcp_tool("example__echo").run(ctx_b, {"text": "hi"})

    assert refused.value.code == "tool_unavailable"


# --- secrets --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_secret_header_reaches_the_http_server(tenant_a, example_url, ctx_a):
    set_secret(tenant_a, "TOKEN", SECRET)
    server = add_server(
        tenant_a,
        "authed",
        MCPServer.Transport.STREAMABLE_HTTP,
        url=example_url,
        headers={"Authorization": "Bearer {{secret:TOKEN}}"},
    )
    refresh_server(server)

    result = mcp_tool("authed__show_auth").run(ctx_a, {})

    assert result.content == f"Bearer {SECRET}"
    server.refresh_from_db()
    assert server.headers == {"Authorization": "Bearer {{secret:TOKEN}}"}  # stored as a reference


@pytest.mark.django_db
def test_a_secret_env_value_reaches_the_stdio_server(tenant_a, ctx_a):
    set_secret(tenant_a, "TOKEN", SECRET)
    server = add_server(
        tenant_a,
        "authed",
        MCPServer.Transport.STDIO,
        **example_stdio_fields(env={"EXAMPLE_TOKEN": "{{secret:TOKEN}}"}),
    )
    refresh_server(server)

    assert mcp_tool("authed__show_auth").run(ctx_a, {}).content == SECRET


@pytest.mark.django_db
def test_a_missing_secret_is_named_not_guessed(tenant_a, example_url):
    server = add_server(
        tenant_a,
        "authed",
        MCPServer.Transport.STREAMABLE_HTTP,
        url=example_url,
        headers={"X-Key": "{{secret:NOPE}}"},
    )

    with pytest.raises(MCPError, match="refers to the secret 'NOPE', which is not set"):
        refresh_server(server)

    server.refresh_from_db()
    assert server.status == MCPServer.Status.ERROR


@pytest.mark.django_db
def test_error_messages_never_carry_a_secret_value(tenant_a):
    set_secret(tenant_a, "TOKEN", SECRET)
    leaky = "import os, sys; sys.stderr.write('token=' + os.environ['LEAK'] + '\\n'); sys.exit(1)"
    server = add_server(
        tenant_a,
        "leaky",
        MCPServer.Transport.STDIO,
        command=sandbox_python(),
        args=["-c", leaky],
        env={"LEAK": "{{secret:TOKEN}}"},
    )

    with pytest.raises(MCPError) as failed:
        refresh_server(server)

    assert SECRET not in str(failed.value)
    assert "token=[REDACTED]" in str(failed.value)  # the server's last words, masked
    server.refresh_from_db()
    assert SECRET not in server.last_error


# --- servers that are down ------------------------------------------------------------------


@pytest.mark.django_db
def test_an_http_server_that_is_down(http_server, dead_url, ctx_a):
    refresh_server(http_server)
    MCPServer.objects.filter(pk=http_server.pk).update(url=dead_url)
    http_server.refresh_from_db()

    with pytest.raises(MCPError) as failed:
        refresh_server(http_server)

    message = str(failed.value)
    assert message.startswith(f"Could not connect to MCP server 'example' at {dead_url}")
    assert "Traceback" not in message
    http_server.refresh_from_db()
    assert http_server.status == MCPServer.Status.ERROR
    assert http_server.last_error == message
    rows = Tool.objects.filter(mcp_server=http_server)
    assert {r.readiness for r in rows} == {Readiness.UNAVAILABLE}
    assert all("is failing" in r.readiness_reason for r in rows)

    with pytest.raises(ToolError) as refused:
        mcp_tool("example__add").run(ctx_a, {"a": 1, "b": 2})
    assert refused.value.code == "mcp_error"
    assert refused.value.stage == "runtime"
    assert "Could not connect to MCP server 'example'" in str(refused.value)


@pytest.mark.django_db
def test_a_stdio_server_that_exits_at_once(tenant_a, ctx_a):
    server = add_server(
        tenant_a,
        "quitter",
        MCPServer.Transport.STDIO,
        command=sandbox_python(),
        args=["-c", "raise SystemExit(3)"],
    )
    Tool.objects.create(
        tenant=tenant_a, name="quitter__work", source=ToolSource.MCP, mcp_server=server, remote_name="work"
    )

    with pytest.raises(MCPError, match=r"MCP server 'quitter' closed the connection .*process exited"):
        refresh_server(server)
    server.refresh_from_db()
    assert server.status == MCPServer.Status.ERROR
    assert "quitter" in server.last_error
    assert Tool.objects.get(name="quitter__work").readiness == Readiness.UNAVAILABLE

    # A call that fails marks the server, but leaves its tools to the next refresh.
    MCPServer.objects.filter(pk=server.pk).update(status=MCPServer.Status.OK, last_error="")
    Tool.objects.filter(name="quitter__work").update(readiness=Readiness.READY, readiness_reason="")
    with pytest.raises(ToolError) as refused:
        mcp_tool("quitter__work").run(ctx_a, {})
    assert refused.value.code == "mcp_error"
    server.refresh_from_db()
    assert server.status == MCPServer.Status.ERROR
    assert server.last_error == str(refused.value)
    assert Tool.objects.get(name="quitter__work").readiness == Readiness.READY


@pytest.mark.django_db
def test_a_stdio_server_that_never_answers_times_out(tenant_a):
    server = add_server(
        tenant_a,
        "sleeper",
        MCPServer.Transport.STDIO,
        command=sandbox_python(),
        args=["-c", "import time; time.sleep(60)"],
        timeout_seconds=1,
    )
    started = time.monotonic()

    with pytest.raises(
        MCPError, match="MCP server 'sleeper' did not answer within 1 second while listing its tools"
    ):
        refresh_server(server)

    assert time.monotonic() - started < 10  # the deadline holds, and the process is stopped


@pytest.mark.django_db
def test_a_stdio_command_that_does_not_exist(tenant_a):
    server = add_server(tenant_a, "ghost", MCPServer.Transport.STDIO, command="/nonexistent/mcp-server")

    with pytest.raises(
        MCPError,
        match="Could not start MCP server 'ghost': the command '/nonexistent/mcp-server' was not found",
    ):
        refresh_server(server)


@pytest.mark.django_db
def test_a_server_that_comes_back_makes_its_tools_ready_again(http_server, example_url, dead_url):
    refresh_server(http_server)
    MCPServer.objects.filter(pk=http_server.pk).update(url=dead_url)
    http_server.refresh_from_db()
    with pytest.raises(MCPError):
        refresh_server(http_server)
    MCPServer.objects.filter(pk=http_server.pk).update(url=example_url)
    http_server.refresh_from_db()

    result = refresh_server(http_server)

    assert result.updated == [] and result.added == []
    assert {t.readiness for t in Tool.objects.filter(mcp_server=http_server)} == {Readiness.READY}
    http_server.refresh_from_db()
    assert (http_server.status, http_server.last_error) == (MCPServer.Status.OK, "")


# --- add_server validation ------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "x", "transport": "stdio"}, "needs a command"),
        ({"name": "x", "transport": "streamable_http"}, "needs a URL"),
        ({"name": "x", "transport": "streamable_http", "url": "ftp://h/mcp"}, "must start with http"),
        ({"name": "x", "transport": "stdio", "command": "srv", "url": "http://h/mcp"}, "not a URL"),
        (
            {"name": "x", "transport": "streamable_http", "url": "http://h/mcp", "command": "srv"},
            "not a command",
        ),
        ({"name": "x", "transport": "smoke", "command": "srv"}, "Unknown transport"),
        ({"name": "Bad Name", "transport": "stdio", "command": "srv"}, "name: Use lowercase"),
        ({"name": "x", "transport": "stdio", "command": "srv", "env": {"1BAD": "v"}}, "Invalid environment"),
        (
            {
                "name": "x",
                "transport": "streamable_http",
                "url": "http://h/mcp",
                "headers": {"Bad Header": "v"},
            },
            "Invalid HTTP header",
        ),
    ],
)
def test_add_server_explains_what_is_wrong(tenant_a, kwargs, message):
    with pytest.raises(ValueError, match=message):
        add_server(tenant_a, **kwargs)
    assert not MCPServer.objects.exists()


@pytest.mark.django_db
def test_add_server_refuses_a_duplicate_name(stdio_server, tenant_a, tenant_b):
    with pytest.raises(ValueError, match="already exists in tenant acme"):
        add_server(tenant_a, "example", MCPServer.Transport.STDIO, command="other")
    # another tenant may use the same name
    assert add_server(tenant_b, "example", MCPServer.Transport.STDIO, command="other").tenant == tenant_b


# --- management commands --------------------------------------------------------------------


@pytest.mark.django_db
def test_mcp_server_add_stdio_prints_the_tools(tenant_a):
    out, err = run_command(
        "mcp_server",
        "add",
        "example",
        "--tenant",
        "acme",
        "--command",
        sys.executable,
        "--arg=-m",
        "--arg",
        "tools_app.mcp.example_server",
        "--env",
        "EXAMPLE_TOKEN={{secret:TOKEN}}",
        "--no-refresh",
    )
    server = MCPServer.objects.for_tenant(tenant_a).get(name="example")
    assert (server.command, server.args) == (sys.executable, ["-m", "tools_app.mcp.example_server"])
    assert server.env == {"EXAMPLE_TOKEN": "{{secret:TOKEN}}"}
    assert out == "" and "Added MCP server example" in err

    # --python-module fills in what runs a module of this project in the sandbox.
    out, _ = run_command(
        "mcp_server", "add", "second", "--tenant", "acme", "--python-module", "tools_app.mcp.example_server"
    )

    assert sorted(out.split()) == sorted(f"second__{name}" for name in EXAMPLE_TOOLS)
    second = MCPServer.objects.for_tenant(tenant_a).get(name="second")
    expected = example_stdio_fields()
    assert (second.command, second.args, second.env, second.sandbox_read_paths) == (
        expected["command"],
        expected["args"],
        expected["env"],
        expected["sandbox_read_paths"],
    )
    assert not second.network_enabled


@pytest.mark.django_db
def test_mcp_server_add_records_the_sandbox_options_and_refuses_unsafe_read_paths(tenant_a, settings):
    run_command(
        "mcp_server",
        "add",
        "fetcher",
        "--tenant",
        "acme",
        "--command",
        "/usr/bin/env",
        "--network",
        "--read-path",
        "/usr/share/zoneinfo",
        "--no-refresh",
    )
    server = MCPServer.objects.for_tenant(tenant_a).get(name="fetcher")
    assert server.network_enabled and server.sandbox_read_paths == ["/usr/share/zoneinfo"]
    assert server.configured_by_operator

    settings.XAGENT_WORKSPACES_DIR = Path("/srv/xagent/workspaces")
    settings.XAGENT_MCP_SERVERS_DIR = Path("/srv/xagent/mcp-servers")
    for path, why in [
        ("/", "whole host"),
        (str(settings.BASE_DIR), "product data"),  # holds var/ (the database, workspaces)
        (str(settings.BASE_DIR / "var"), "product data"),
        (str(settings.XAGENT_WORKSPACES_DIR), "product data"),
        (str(settings.XAGENT_MCP_SERVERS_DIR / "1"), "product data"),  # other servers' directories
        ("/proc/1", "sandbox provides itself"),
        ("/tmp", "sandbox provides itself"),  # below it is fine: bound over the sandbox's own tmpfs
        ("relative/path", "absolute"),
        ("/usr/../etc", "normalized"),
        ("/nonexistent/dir", "does not exist"),
    ]:
        with pytest.raises(CommandError, match=why):
            run_command(
                "mcp_server", "add", "bad", "--tenant", "acme", "--command", "srv", "--read-path", path
            )
    with pytest.raises(CommandError, match="belong to a stdio server"):
        run_command("mcp_server", "add", "bad", "--tenant", "acme", "--url", "https://h/mcp", "--network")
    assert not MCPServer.objects.filter(name="bad").exists()


@pytest.mark.django_db
def test_mcp_server_add_and_refresh_over_http_print_the_tools(tenant_a, example_url):
    set_secret(tenant_a, "TOKEN", SECRET)
    expected = sorted(f"remote__{name}" for name in EXAMPLE_TOOLS)

    added, _ = run_command(
        "mcp_server",
        "add",
        "remote",
        "--tenant",
        "acme",
        "--url",
        example_url,
        "--header",
        "Authorization=Bearer {{secret:TOKEN}}",
    )
    refreshed, summary = run_command("mcp_server", "refresh", "remote", "--tenant", "acme")

    assert sorted(added.split()) == expected
    assert sorted(refreshed.split()) == expected
    assert f"{len(EXAMPLE_TOOLS)} tools from remote: 0 added, 0 updated, 0 no longer listed" in summary
    server = MCPServer.objects.for_tenant(tenant_a).get(name="remote")
    assert server.headers == {"Authorization": "Bearer {{secret:TOKEN}}"}


@pytest.mark.django_db
def test_mcp_server_refresh_cannot_reach_another_tenants_server(http_server, tenant_a, outsider_b):
    with pytest.raises(CommandError, match="No MCP server example in tenant bravo"):
        run_command("mcp_server", "refresh", "example", "--tenant", "bravo")
    http_server.refresh_from_db()
    assert http_server.status == MCPServer.Status.UNKNOWN  # not even contacted


@pytest.mark.django_db
def test_mcp_server_refresh_fails_clearly_when_the_server_is_down(tenant_a, dead_url):
    add_server(tenant_a, "gone", MCPServer.Transport.STREAMABLE_HTTP, url=dead_url)

    with pytest.raises(
        CommandError, match="Refreshing the tools of MCP server gone failed: Could not connect"
    ):
        run_command("mcp_server", "refresh", "gone", "--tenant", "acme")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenant", "nowhere", "--command", "srv"], "No tenant with slug 'nowhere'"),
        (
            ["--tenant", "acme", "--url", "http://127.0.0.1:1/mcp", "--env", "A=1"],
            "--arg and --env belong to a stdio",
        ),
        (
            ["--tenant", "acme", "--command", "srv", "--header", "A=1"],
            "--header belongs to a Streamable HTTP",
        ),
        (["--tenant", "acme", "--command", "srv", "--env", "NOEQUALS"], "Invalid --env 'NOEQUALS'"),
        (["--tenant", "acme", "--url", "ftp://127.0.0.1/mcp"], "must start with http"),
    ],
)
def test_mcp_server_add_refuses_bad_input(tenant_a, args, message):
    with pytest.raises(CommandError, match=message):
        run_command("mcp_server", "add", "x", *args, "--no-refresh")
    assert not MCPServer.objects.exists()


def test_mcp_probe_exercises_every_tool(example_url):
    out, _ = run_command("mcp_probe", "--header", "Authorization=Bearer probe-token", example_url)

    assert f"{len(EXAMPLE_TOOLS)} tools at {example_url}" in out
    assert 'add({"a": 1, "b": 1})\n  result: 2' in out
    assert "fail(" in out and "error result: " in out  # a tool-level error is still a working exchange
    assert "show_auth({})\n  result: Bearer probe-token" in out


def test_mcp_probe_fails_on_a_dead_port(dead_url):
    with pytest.raises(CommandError, match="Could not connect"):
        run_command("mcp_probe", dead_url)


def test_mcp_probe_exit_status_from_the_command_line(example_url, dead_url):
    def probe(url):
        return subprocess.run(
            [sys.executable, "manage.py", "mcp_probe", url],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    worked, failed = probe(example_url), probe(dead_url)

    assert worked.returncode == 0, worked.stderr
    assert "word_count(" in worked.stdout
    assert failed.returncode != 0
    assert "Could not connect to MCP server" in failed.stderr
    assert "Traceback" not in failed.stderr


@pytest.mark.django_db
def test_a_deleted_server_takes_its_directory_with_it(tenant_a, tenant_b, django_capture_on_commit_callbacks):
    from tools_app.mcp.stdio import server_directory

    kept = add_server(tenant_b, "kept", MCPServer.Transport.STDIO, command="/bin/true")
    servers = [add_server(tenant_a, name, MCPServer.Transport.STDIO, command="/bin/true") for name in "ab"]
    for server in [*servers, kept]:
        (server_directory(server) / "cache.json").write_text("{}")
    outside = server_directory(kept).parent.parent / "outside.txt"
    outside.write_text("not the server's")
    (server_directory(servers[0]) / "link").symlink_to(outside)  # a link the server planted
    paths = [server_directory(server) for server in servers]

    with django_capture_on_commit_callbacks(execute=True):
        servers[0].delete()  # the admin's delete
    assert not paths[0].exists() and paths[1].exists()
    with django_capture_on_commit_callbacks(execute=True):
        tenant_a.delete()  # a cascade from the tenant

    assert not paths[1].exists()
    assert (server_directory(kept) / "cache.json").exists()  # another tenant's server is untouched
    assert outside.read_text() == "not the server's"  # the link was removed, not followed
