"""Pure pieces of MCP support: naming, hint defaults, probe arguments, messages. No servers."""

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from approvals_app.choices import Risk
from tools_app.management.commands.mcp_probe import arguments_for
from tools_app.mcp.client import Connection, MCPError, RemoteResult, _describe, _public_url, list_tools
from tools_app.mcp.sync import defaults_from_hints, tool_name_for

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def test_tool_name_joins_server_and_remote_name():
    assert tool_name_for("example", "add") == "example__add"


def test_tool_name_replaces_characters_a_model_cannot_call():
    assert tool_name_for("docs", "search.pages/v2 beta") == "docs__search_pages_v2_beta"


def test_long_tool_names_fit_and_stay_distinct():
    a = tool_name_for("server", "x" * 80 + "_alpha")
    b = tool_name_for("server", "x" * 80 + "_beta")
    assert NAME.match(a) and NAME.match(b)
    assert a != b


@pytest.mark.parametrize(
    ("hints", "risk", "read_only", "idempotent"),
    [
        ({"readOnlyHint": True}, Risk.READ, True, False),
        ({"readOnlyHint": True, "idempotentHint": True}, Risk.READ, True, True),
        ({"readOnlyHint": False, "destructiveHint": True}, Risk.DESTRUCTIVE, False, False),
        ({"destructiveHint": False, "openWorldHint": True}, Risk.EXTERNAL, False, False),
        ({"readOnlyHint": False, "destructiveHint": False, "openWorldHint": False}, Risk.WRITE, False, False),
        ({}, Risk.WRITE, False, False),
    ],
)
def test_defaults_follow_the_declared_hints(hints, risk, read_only, idempotent):
    assert defaults_from_hints(hints) == {"risk": risk, "read_only": read_only, "idempotent": idempotent}


def test_probe_arguments_fill_required_properties_by_type():
    schema = {
        "type": "object",
        "properties": {
            "text": {"type": "string"},
            "count": {"type": "integer"},
            "ratio": {"type": "number"},
            "flag": {"type": "boolean"},
            "items": {"type": "array", "items": {"type": "string"}},
            "options": {
                "type": "object",
                "properties": {"depth": {"type": "integer"}, "label": {"type": "string"}},
                "required": ["depth"],
            },
            "optional": {"type": "string"},
        },
        "required": ["text", "count", "ratio", "flag", "items", "options"],
    }
    assert arguments_for(schema) == {
        "text": "probe",
        "count": 1,
        "ratio": 1,
        "flag": True,
        "items": [],
        "options": {"depth": 1},
    }


def test_probe_arguments_follow_refs_enums_and_nullable_types():
    schema = {
        "type": "object",
        "$defs": {"Mode": {"type": "string", "enum": ["fast", "slow"]}},
        "properties": {
            "mode": {"$ref": "#/$defs/Mode"},
            "note": {"anyOf": [{"type": "null"}, {"type": "string"}]},
            "size": {"type": ["null", "integer"]},
        },
        "required": ["mode", "note", "size"],
    }
    assert arguments_for(schema) == {"mode": "fast", "note": "probe", "size": 1}


def test_probe_arguments_for_a_tool_without_parameters():
    assert arguments_for({"type": "object", "properties": {}}) == {}
    assert arguments_for({}) == {}


def test_messages_drop_credentials_from_urls():
    assert _public_url("https://user:pw@mcp.example.com:8443/mcp") == "https://mcp.example.com:8443/mcp"


def test_a_timeout_message_names_the_server_and_the_step():
    conn = Connection(server_name="docs", transport="stdio", command="docs-server")
    message = _describe(conn, "listing its tools", TimeoutError(), 5, "")
    assert message == "MCP server 'docs' did not answer within 5 seconds while listing its tools."


def test_connection_repr_hides_resolved_secrets():
    conn = Connection(
        server_name="docs",
        transport="streamable_http",
        url="http://127.0.0.1:1/mcp",
        headers={"Authorization": "Bearer s3cr3t-value"},
        secret_values=("s3cr3t-value",),
    )
    assert "s3cr3t-value" not in repr(conn)


def test_remote_result_defaults():
    assert RemoteResult(text="x") == RemoteResult(text="x", structured=None, is_error=False)


class Refusing(BaseHTTPRequestHandler):
    """Answers every request with the status named by the first path segment."""

    def do_POST(self):
        self.send_response(int(self.path.strip("/").split("/")[0]))
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"no")

    do_GET = do_DELETE = do_POST

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("status", "hint"),
    [(401, "not authorized"), (404, "no MCP endpoint at this URL"), (500, "")],
)
def test_an_http_error_status_is_named_without_the_credential(refusing_url, status, hint):
    conn = Connection(
        server_name="docs",
        transport="streamable_http",
        url=f"{refusing_url}/{status}/mcp",
        headers={"Authorization": "Bearer s3cr3t-value"},
        secret_values=("s3cr3t-value",),
        timeout=5,
    )

    with pytest.raises(MCPError) as failed:
        list_tools(conn)

    message = str(failed.value)
    assert message.startswith(f"MCP server 'docs' at {refusing_url}/{status}/mcp answered HTTP {status}")
    assert hint in message
    assert "s3cr3t-value" not in message


class DiscoverRefusing(BaseHTTPRequestHandler):
    """Answers the SDK's `server/discover` probe 400 (as pre-discover servers do) and everything
    else 403: the 403 is what stops the client."""

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(400 if b"server/discover" in body else 403)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"no")

    do_GET = do_DELETE = do_POST

    def log_message(self, *args):
        pass


def test_the_failing_request_is_named_not_the_discover_probe():
    server = ThreadingHTTPServer(("127.0.0.1", 0), DiscoverRefusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/mcp"
    try:
        with pytest.raises(MCPError) as failed:
            list_tools(Connection(server_name="docs", transport="streamable_http", url=url, timeout=5))
    finally:
        server.shutdown()
        server.server_close()

    assert str(failed.value).startswith(f"MCP server 'docs' at {url} answered HTTP 403 (forbidden")
