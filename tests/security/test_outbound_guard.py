"""The outbound guard (issue #8, part 2; ARCHITECTURE §7): endpoints a tenant admin sets (HTTP MCP
servers, model base URLs) never reach loopback, private, link-local or metadata addresses unless
an operator allow-lists the host, checked at every connect; operator endpoints are exempt.

A tiny loopback HTTP server counts requests: a refused endpoint must leave the count at 0.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2
import pytest

from sessions_app.models import ModelConfig, Turn
from sessions_app.runtime.llm.config import resolve_model
from tests.integration.processes import free_port, running, wait_for_port
from tests.runtime.helpers import drive_until_idle, new_session, send
from tests.support.model_server import text_reply
from tools_app import net
from tools_app.mcp.client import MCPError
from tools_app.mcp.sync import add_server, refresh_server
from tools_app.models import MCPServer

MCP_ADMIN = "/admin/tools_app/mcpserver"
MODEL_ADMIN = "/admin/sessions_app/modelconfig"
PUBLIC = "93.184.215.14"  # a public address (never contacted: the tests pin or refuse first)


class Counting(BaseHTTPRequestHandler):
    hits: list[str]

    def _answer(self):
        self.hits.append(self.path)
        self.send_response(401)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"internal-service-says-hello")

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def counting_server():
    hits: list[str] = []
    handler = type("Handler", (Counting,), {"hits": hits})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.hits = hits
    server.port = server.server_address[1]
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def example_server(tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("mcp") / "example_server.log"
    cmd = [
        sys.executable,
        "-m",
        "tools_app.mcp.example_server",
        "--http",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with running(cmd, dict(os.environ), log_path) as proc:
        wait_for_port(port, proc, log_path)
        yield port


def http_post(tenant, url, name="remote") -> dict:
    return {"tenant": tenant.pk, "name": name, "transport": "streamable_http", "url": url, "headers": "{}",
            "timeout_seconds": 5, "enabled": "on"}  # fmt: skip


def refresh_action(client, server):
    return client.post(
        f"{MCP_ADMIN}/", {"action": "test_and_refresh", "_selected_action": [server.pk]}, follow=True
    )


# --- the rule itself ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "rule"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("10.0.0.8", "private"),
        ("192.168.1.1", "private"),
        ("172.16.0.1", "private"),
        ("100.64.0.1", "private"),
        ("fd12::1", "private"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_addresses_are_judged_by_their_range(address, rule):
    assert net.address_rule(address) == rule


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/", "gopher://x/", "http:///nohost"])
def test_only_http_and_https_urls_pass(url):
    with pytest.raises(net.OutboundRefused, match="Outbound guard|not a valid URL"):
        net.check_url(url, resolver=lambda host, port: [PUBLIC])


def test_the_allow_list_takes_a_host_or_a_host_and_port(settings):
    settings.XAGENT_OUTBOUND_ALLOWED_HOSTS = ["vllm.internal", "127.0.0.1:8765", "[::1]:9000"]
    assert net.is_allow_listed("vllm.internal", 443) and net.is_allow_listed("VLLM.internal.", 1)
    assert net.is_allow_listed("127.0.0.1", 8765) and not net.is_allow_listed("127.0.0.1", 8766)
    assert net.is_allow_listed("::1", 9000) and not net.is_allow_listed("::1", 80)
    assert net.check_url("http://127.0.0.1:8765/mcp") == ["127.0.0.1"]
    with pytest.raises(net.OutboundRefused, match="loopback"):
        net.check_url("http://127.0.0.1:8766/mcp")


def test_dns_rebinding_is_refused_at_connect(monkeypatch, counting_server):
    """Public at save time, loopback at connect time: the connect-time check refuses it."""
    answers = iter([[PUBLIC], ["127.0.0.1"]])
    monkeypatch.setattr(net, "resolve_host", lambda host, port: next(answers))
    url = f"http://rebind.example:{counting_server.port}/mcp"

    assert net.check_url(url) == [PUBLIC]  # what a save would see
    with (
        httpx2.Client(transport=net.guarded_transport()) as client,
        pytest.raises(net.OutboundRefused) as refused,
    ):
        client.get(url)

    assert refused.value.rule == "loopback"
    assert counting_server.hits == []


def test_the_connection_goes_to_the_checked_address(monkeypatch, settings, counting_server):
    """Pinned: the name never resolves again after the check (here it does not exist at all)."""
    settings.XAGENT_OUTBOUND_ALLOWED_HOSTS = ["pinned.invalid"]
    monkeypatch.setattr(net, "resolve_host", lambda host, port: ["127.0.0.1"])
    with httpx2.Client(transport=net.guarded_transport()) as client:
        assert client.get(f"http://pinned.invalid:{counting_server.port}/x").status_code == 401
    assert counting_server.hits == ["/x"]


# --- MCP servers -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_tenant_admin_cannot_save_a_loopback_mcp_url(owner_a_admin, tenant_a, counting_server):
    url = f"http://127.0.0.1:{counting_server.port}/mcp"
    response = owner_a_admin.post(f"{MCP_ADMIN}/add/", http_post(tenant_a, url))

    page = response.content.decode()
    assert response.status_code == 200 and "resolves to a loopback address" in page
    assert "XAGENT_OUTBOUND_ALLOWED_HOSTS" in page
    assert not MCPServer.objects.exists()
    assert counting_server.hits == []


@pytest.mark.django_db
def test_a_tenant_mcp_url_on_loopback_is_refused_at_connect(owner_a_admin, tenant_a, counting_server):
    # As if its name resolved to a public address at save time and to loopback now.
    server = MCPServer.objects.create(
        tenant=tenant_a,
        name="remote",
        transport="streamable_http",
        url=f"http://127.0.0.1:{counting_server.port}/mcp",
        headers={"Authorization": "Bearer x"},
    )

    page = refresh_action(owner_a_admin, server).content.decode()

    assert "was not contacted" in page and "loopback" in page
    # (the port is random: "401" may be part of it)
    page = page.replace(str(counting_server.port), "PORT")
    assert "401" not in page and "internal-service-says-hello" not in page
    assert counting_server.hits == []
    with pytest.raises(MCPError, match="Outbound guard"):
        refresh_server(server)
    assert counting_server.hits == []


@pytest.mark.django_db
def test_a_tenant_endpoints_answer_is_not_echoed(settings, tenant_a, counting_server):
    settings.XAGENT_OUTBOUND_ALLOWED_HOSTS = [f"127.0.0.1:{counting_server.port}"]
    server = MCPServer.objects.create(
        tenant=tenant_a,
        name="remote",
        transport="streamable_http",
        url=f"http://127.0.0.1:{counting_server.port}/mcp",
    )
    with pytest.raises(MCPError) as failed:
        refresh_server(server)
    assert counting_server.hits  # allow-listed: it was contacted
    message = str(failed.value).replace(str(counting_server.port), "PORT")  # "401" may be in the port
    assert "401" not in message and "not shown" in message


@pytest.mark.django_db
def test_an_allow_listed_host_works_for_a_tenant(settings, owner_a_admin, tenant_a, example_server):
    settings.XAGENT_OUTBOUND_ALLOWED_HOSTS = [f"127.0.0.1:{example_server}"]
    response = owner_a_admin.post(
        f"{MCP_ADMIN}/add/", http_post(tenant_a, f"http://127.0.0.1:{example_server}/mcp")
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    server = MCPServer.objects.get(tenant=tenant_a, name="remote")
    assert not server.configured_by_operator  # still a tenant endpoint, passing the guard

    page = refresh_action(owner_a_admin, server).content.decode()
    assert "emote: connected; 9 tool(s)" in page


@pytest.mark.django_db
def test_operator_mcp_endpoints_are_exempt(operator_admin, tenant_a, example_server):
    server = add_server(
        tenant_a, "example", MCPServer.Transport.STREAMABLE_HTTP, url=f"http://127.0.0.1:{example_server}/mcp"
    )
    assert len(refresh_server(server).tools) == 9  # manage.py's path: loopback is fine

    response = operator_admin.post(
        f"{MCP_ADMIN}/add/", http_post(tenant_a, f"http://127.0.0.1:{example_server}/mcp", name="byroot")
    )
    assert response.status_code == 302
    assert MCPServer.objects.get(name="byroot").configured_by_operator


@pytest.mark.django_db
def test_a_tenant_change_of_an_operator_url_puts_it_behind_the_guard(owner_a_admin, tenant_a, example_server):
    server = add_server(
        tenant_a, "example", MCPServer.Transport.STREAMABLE_HTTP, url="https://mcp.example.com/mcp"
    )
    server = MCPServer.objects.get(pk=server.pk)
    server.url = f"http://127.0.0.1:{example_server}/mcp"
    server.save()  # not an operator's save
    server.refresh_from_db()
    assert not server.configured_by_operator
    with pytest.raises(MCPError, match="loopback"):
        refresh_server(server)


# --- model base URLs ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_tenant_model_base_url_on_loopback_fails_the_turn_naming_the_rule(tenant_a, owner_a, model_server):
    ModelConfig.objects.create(
        tenant=tenant_a, name="sneaky", base_url=model_server.base_url, model="m", is_default=True
    )
    model_server.script("agent", text_reply("you should never see this"))
    session = new_session(tenant_a, owner_a)
    send(session, "hello")
    drive_until_idle(session)

    turn = Turn.objects.get(session=session)
    assert turn.reason == "error"
    assert "Outbound guard" in turn.reason_detail and "loopback" in turn.reason_detail
    assert model_server.all_requests == []


@pytest.mark.django_db(transaction=True)
def test_an_allow_listed_model_host_works_for_a_tenant(settings, tenant_a, owner_a, model_server):
    host_port = model_server.base_url.split("//", 1)[1].split("/", 1)[0]
    settings.XAGENT_OUTBOUND_ALLOWED_HOSTS = [host_port]
    config = ModelConfig.objects.create(
        tenant=tenant_a, name="local", base_url=model_server.base_url, model="m", is_default=True
    )
    assert not config.configured_by_operator
    model_server.script("agent", text_reply("hi there"))
    session = new_session(tenant_a, owner_a)
    send(session, "hello")
    drive_until_idle(session)
    assert Turn.objects.get(session=session).reason == "completed"
    assert len(model_server.requests) == 1


@pytest.mark.django_db
def test_the_model_config_admin_refuses_a_tenant_loopback_url_and_trusts_an_operator(
    owner_a_admin, operator_admin, tenant_a, model_server, monkeypatch
):
    form = {"tenant": tenant_a.pk, "name": "local", "base_url": model_server.base_url, "api_key": "",
            "model": "m", "context_window": 32000, "max_output_tokens": 1024}  # fmt: skip
    response = owner_a_admin.post(f"{MODEL_ADMIN}/add/", form)
    assert response.status_code == 200 and "resolves to a loopback address" in response.content.decode()
    assert not ModelConfig.objects.exists()

    assert operator_admin.post(f"{MODEL_ADMIN}/add/", form).status_code == 302
    config = ModelConfig.objects.get(name="local")
    assert config.configured_by_operator

    # A tenant admin's new URL makes it a tenant endpoint again (and a public one passes the save check).
    monkeypatch.setattr(net, "resolve_host", lambda host, port: [PUBLIC])  # no DNS needed
    monkey_form = {**form, "base_url": "https://api.openai.com/v1"}
    assert owner_a_admin.post(f"{MODEL_ADMIN}/{config.pk}/change/", monkey_form).status_code == 302
    config.refresh_from_db()
    assert not config.configured_by_operator
    assert model_server.all_requests == []


@pytest.mark.django_db
def test_the_environment_default_model_is_an_operator_endpoint(settings, tenant_a, owner_a):
    settings.OPENAI_API_KEY, settings.OPENAI_BASE_URL = "sk-test", "http://127.0.0.1:9/v1"
    assert resolve_model(new_session(tenant_a, owner_a)).guarded is False


class _PointsElsewhere(BaseHTTPRequestHandler):
    """An operator's MCP endpoint that wants OAuth and names an authorization server at
    `elsewhere` (another loopback port: a host that server's operator, not ours, chose)."""

    elsewhere = ""

    def log_message(self, *args):
        pass

    def _json(self, status: int, body: dict, extra: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        host, port = self.server.server_address[:2]
        if self.path.startswith("/.well-known/oauth-protected-resource"):
            self._json(
                200, {"resource": f"http://{host}:{port}/mcp", "authorization_servers": [self.elsewhere]}
            )
        else:
            self._json(404, {})

    def do_POST(self):
        host, port = self.server.server_address[:2]
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        metadata = f"http://{host}:{port}/.well-known/oauth-protected-resource"
        self._json(401, {}, {"WWW-Authenticate": f'Bearer resource_metadata="{metadata}"'})


@pytest.mark.django_db(transaction=True)  # Connect runs the flow in a thread of its own
def test_an_operator_oauth_servers_metadata_cannot_send_us_to_a_private_address(
    tenant_a, owner_a_admin, counting_server
):
    from django.urls import reverse

    handler = type("Handler", (_PointsElsewhere,), {"elsewhere": f"http://127.0.0.1:{counting_server.port}"})
    resource = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=resource.serve_forever, daemon=True).start()
    try:
        server = add_server(
            tenant_a,
            "operators",
            MCPServer.Transport.STREAMABLE_HTTP,
            url=f"http://127.0.0.1:{resource.server_address[1]}/mcp",
            by_operator=True,
        )
        server.auth_mode = MCPServer.AuthMode.OAUTH
        server.save(by_operator=True)
        answer = owner_a_admin.post(
            reverse("admin:tools_app_mcpserver_connect", args=[server.pk]), follow=True
        )

        messages = " ".join(str(m) for m in answer.context["messages"])
        assert "Outbound guard" in messages and "loopback" in messages, messages
        # The authorization server the operator's endpoint named was never contacted.
        assert counting_server.hits == []
    finally:
        resource.shutdown()
        resource.server_close()


def test_the_trusted_origin_is_exact(counting_server):
    backend = net.AsyncGuardedBackend(trusted=net.origin_of(f"http://127.0.0.1:{counting_server.port}/mcp"))
    assert backend._addresses("127.0.0.1", counting_server.port) == ["127.0.0.1"]
    with pytest.raises(net.OutboundRefused):
        backend._addresses("127.0.0.1", counting_server.port + 1)
    with pytest.raises(net.OutboundRefused):
        backend._addresses("localhost", counting_server.port)
