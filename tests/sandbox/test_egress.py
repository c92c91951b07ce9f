"""A sandbox whose policy allows network reaches public hosts through the outbound guard only.

The "public host" is a stand-in: an HTTP server on the loopback alias 127.0.0.2 that the operator
allow-lists (XAGENT_OUTBOUND_ALLOWED_HOSTS), as the issue's acceptance asks. Everything else on
the host's loopback (a listener standing for PostgreSQL, Redis or the app) and the metadata
address are refused: by the proxy with a 403 that says why, and directly for lack of any route.
No traffic leaves loopback: the refused addresses are refused before any connection is made.
"""

from __future__ import annotations

import os
import socket

import pytest
from django.test import override_settings

from tests.support.public_stand_in import STAND_IN, public_stand_in
from tools_app.sandbox import SandboxLimits, egress, run_sandboxed
from tools_app.sandbox import process as sandbox_process

pytestmark = [
    pytest.mark.skipif(not os.access(sandbox_process.BWRAP, os.X_OK), reason="bubblewrap is not installed"),
    pytest.mark.skipif(not os.access(egress.PYTHON, os.X_OK), reason=f"{egress.PYTHON} is not installed"),
]


@pytest.fixture
def stand_in():
    with public_stand_in() as port:
        yield port


@pytest.fixture
def host_service():
    """A listener on the host's 127.0.0.1 standing for PostgreSQL / Redis / the app's port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    yield listener
    listener.close()


def accepted(listener: socket.socket) -> bool:
    try:
        conn, _ = listener.accept()
    except (TimeoutError, OSError):
        return False
    conn.close()
    return True


def run(command: str, workspace, **limits):
    return run_sandboxed(command, workspace, SandboxLimits(network=True, wall_seconds=30, **limits))


@override_settings(XAGENT_OUTBOUND_ALLOWED_HOSTS=[STAND_IN])
def test_an_allow_listed_host_is_reached_through_the_proxy(workspace, stand_in):
    result = run(
        f"curl -sS http://{STAND_IN}:{stand_in}/plain; "
        f"curl -sS --proxytunnel http://{STAND_IN}:{stand_in}/tunnel; "
        f"python3 -c \"import urllib.request; print(urllib.request.urlopen('http://{STAND_IN}:{stand_in}/py').read().decode(), end='')\"",
        workspace,
    )

    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        "hello from the public stand-in, path /plain",  # absolute-form HTTP through the proxy
        "hello from the public stand-in, path /tunnel",  # CONNECT, as https uses
        "hello from the public stand-in, path /py",  # Python honours HTTP_PROXY too
    ]


@override_settings(XAGENT_OUTBOUND_ALLOWED_HOSTS=[STAND_IN])
def test_the_hosts_services_are_refused(workspace, stand_in, host_service):
    port = host_service.getsockname()[1]
    with override_settings(XAGENT_SANDBOX_EGRESS_PORTS=[80, 443, port]):  # the guard decides, not the port
        result = run(
            f"curl -s -w '|%{{http_code}}\\n' http://127.0.0.1:{port}/; "
            f"curl -s -w '|%{{http_code}}\\n' http://localhost:{port}/; "
            f"curl -s -w '|%{{http_code}}\\n' http://[::ffff:127.0.0.1]:{port}/; "
            f"curl -sS --proxytunnel http://127.0.0.1:{port}/ 2>&1 | tail -n 1",
            workspace,
        )

    out = result.stdout
    assert out.count("|403") == 3, out + result.stderr
    assert out.count("resolves to a loopback address") == 3, out
    assert out.rstrip().endswith("CONNECT tunnel failed, response 403"), out  # CONNECT: the same answer
    assert not accepted(host_service)


def test_a_refused_address_is_named_whatever_its_port(workspace, host_service):
    port = host_service.getsockname()[1]  # not an open egress port either
    result = run(f"curl -s -w '|%{{http_code}}\\n' http://127.0.0.1:{port}/", workspace)

    assert "resolves to a loopback address" in result.stdout, result.stdout
    assert "|403" in result.stdout
    assert not accepted(host_service)


@pytest.mark.parametrize(
    "host, rule",
    [
        ("169.254.169.254", "metadata"),
        ("10.0.0.1", "private"),
        ("fd00::1", "private"),
        ("0.0.0.0", "unspecified"),
    ],
)
def test_what_the_proxy_refuses_without_connecting(host, rule):
    # Checked without a sandbox, so no packet could go anywhere even if the rule were broken.
    with pytest.raises(egress._Refused) as refused:
        egress.authorize(host, 80)
    assert f"a {rule} address" in refused.value.reason


def test_no_direct_route_to_the_hosts_loopback(workspace, host_service):
    port = host_service.getsockname()[1]
    script = (
        "import socket\n"
        f"for address in [('127.0.0.1', {port}), ('{STAND_IN}', {port})]:\n"
        "    try:\n"
        "        socket.create_connection(address, timeout=2); print('CONNECTED', address)\n"
        "    except OSError as exc: print('refused', type(exc).__name__)\n"
    )
    result = run(f"python3 -c {sandbox_quote(script)}", workspace)

    assert "CONNECTED" not in result.stdout
    assert result.stdout.count("refused") == 2, result.stdout + result.stderr
    assert not accepted(host_service)


def test_without_an_allow_list_even_the_stand_in_is_refused(workspace, stand_in):
    result = run(f"curl -s -w ' %{{http_code}}\\n' http://{STAND_IN}:{stand_in}/", workspace)

    assert result.stdout.strip().endswith("403")
    assert "XAGENT_OUTBOUND_ALLOWED_HOSTS" in result.stdout


def test_ports_outside_the_operators_list_are_refused_before_any_lookup():
    with pytest.raises(egress._Refused) as refused:
        egress.authorize("mail.example.com", 25)  # refused before the name is even resolved
    assert refused.value.status.startswith("403")
    assert "port 25 is not open" in refused.value.reason


def test_a_sandbox_without_network_has_no_proxy(workspace):
    result = run_sandboxed(
        "echo ${HTTP_PROXY:-none}; ls /run/xagent 2>&1 | head -n 1", workspace, SandboxLimits(network=False)
    )
    assert result.stdout.splitlines()[0] == "none"
    assert "No such file" in result.stdout


def sandbox_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
