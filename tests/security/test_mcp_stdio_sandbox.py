"""stdio MCP servers run inside the ProcessSandbox (issue #14, point 4; ARCHITECTURE §7).

A hostile MCP server (`tests/support/hostile_mcp_server.py`, a real process under real bwrap)
tries to read and write outside its own directory, reach a loopback listener this test runs,
flood processes and memory, and leave a child behind. Each attempt reports what happened; the
test checks the attempt failed (or, for the network, succeeds only once an operator enabled it)
and that the host is unchanged. Several attempts share one connection (one server process):
each server start costs a Python start-up.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection as db_connection

from config import sandbox_reach
from tests.sandbox.test_sandbox import host_cmdlines_containing
from tools_app.mcp import client as mcp_client
from tools_app.mcp.client import MCPError, connection_for
from tools_app.mcp.stdio import python_module_launch, server_directory
from tools_app.mcp.sync import add_server, refresh_server, save_server
from tools_app.models import MCPServer, SandboxPolicy
from tools_app.sandbox import DEFAULT_LIMITS
from tools_app.sandbox import process as sandbox_process
from tools_app.sandbox.server import ServerSandbox, prepare_server
from tools_app.secrets import set_secret, tenant_secret_values

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        not os.access(sandbox_process.BWRAP, os.X_OK),
        reason=f"bubblewrap is not installed at {sandbox_process.BWRAP} (CI installs it)",
    ),
]

IS_ROOT = os.geteuid() == 0
SANDBOX_UIDS = range(settings.XAGENT_SANDBOX_UIDS[0], settings.XAGENT_SANDBOX_UIDS[1] + 1)


def is_sandbox_identity(uid: int, gid: int) -> bool:
    """A root worker's servers run as a uid of their own (gid = uid); otherwise as the worker."""
    return (uid in SANDBOX_UIDS and gid == uid) if IS_ROOT else (uid, gid) == (os.getuid(), os.getgid())


HOSTILE_MODULE = "tests.support.hostile_mcp_server"
HOST_SECRET = "host-secret-9c2e"


def add_hostile(tenant, name: str = "hostile", env: dict | None = None, **fields) -> MCPServer:
    launch = python_module_launch(HOSTILE_MODULE)
    return add_server(
        tenant,
        name,
        MCPServer.Transport.STDIO,
        command=launch.command,
        args=launch.args,
        env={**launch.env, **(env or {})},
        sandbox_read_paths=launch.read_paths,
        **fields,
    )


def in_one_session(server: MCPServer, calls: list[tuple[str, dict]], while_connected=None) -> list[dict]:
    """Run `calls` against one start of the server (the product's client, one connection);
    `while_connected()` runs on the host after the calls, before the server is stopped."""
    conn = connection_for(server, tenant_secret_values(server.tenant_id))

    async def operation(client, renew):
        import anyio.to_thread

        results = []
        for name, arguments in calls:
            renew()
            raw = await client.call_tool(name, arguments)
            results.append(json.loads(mcp_client._to_result(raw).text))
        if while_connected is not None:
            results.append(await anyio.to_thread.run_sync(while_connected))
        return results

    return mcp_client._run(conn, "testing the sandbox", operation, 120)


def wait_for_no_process_with(marker: str) -> list[int]:
    deadline = time.monotonic() + 10
    while (found := host_cmdlines_containing(marker.encode())) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@pytest.fixture
def hostile(tenant_a) -> MCPServer:
    return add_hostile(tenant_a)


@pytest.fixture
def listener():
    """A TCP listener on 127.0.0.1 that counts the connections it accepts."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(0.1)
    accepted: list[int] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                peer, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(1)
            peer.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1], accepted
    stop.set()
    thread.join(5)
    sock.close()


@pytest.fixture
def other_servers_file(tenant_b) -> Path:
    """A file in another tenant's server directory, readable by anyone on the host: only the
    sandbox hides it."""
    other = add_hostile(tenant_b, "other")
    secret_file = server_directory(other) / "secret.txt"
    secret_file.write_text(HOST_SECRET)
    secret_file.parent.chmod(0o755)
    secret_file.chmod(0o644)
    return secret_file


@pytest.fixture
def workspace_file(settings, mcp_servers_dir) -> Path:
    """A file in a Session workspace, readable by anyone on the host: only the sandbox hides it."""
    root = mcp_servers_dir.parent / f"workspaces-{secrets.token_hex(4)}"
    workspace = root / "1" / "session-1"
    workspace.mkdir(parents=True)
    for path in (root, root / "1"):
        path.chmod(0o711)
    settings.XAGENT_WORKSPACES_DIR = root
    secret_file = workspace / "notes.txt"
    secret_file.write_text(HOST_SECRET)
    workspace.chmod(0o755)
    secret_file.chmod(0o644)
    return secret_file


# --- identity and its own directory ----------------------------------------------------------


def test_a_server_runs_as_the_sandbox_uid_in_its_own_persistent_directory(hostile):
    me, wrote, listed = in_one_session(
        hostile,
        [("whoami", {}), ("write_file", {"path": "state.txt", "text": "kept"}), ("list_dir", {"path": "."})],
    )

    assert is_sandbox_identity(me["uid"], me["gid"])
    assert me["cwd"] == me["home"] == "/server"
    assert wrote["ok"] and listed["entries"] == ["state.txt"]
    own = server_directory(hostile)
    assert (own / "state.txt").read_text() == "kept"  # on the host, in the server's directory
    assert own.parent == Path(settings.XAGENT_MCP_SERVERS_DIR) / str(hostile.tenant_id)

    # The next start of the server finds what it kept.
    (again,) = in_one_session(hostile, [("read_file", {"path": "/server/state.txt"})])
    assert again == {"ok": True, "data": "kept"}


# --- filesystem -------------------------------------------------------------------------------


def test_a_server_cannot_read_outside_its_directory(hostile, other_servers_file, workspace_file):
    targets = [
        str(other_servers_file),  # another tenant's server directory
        str(workspace_file),  # a Session workspace
        str(Path(settings.BASE_DIR) / "manage.py"),  # the project (only its bound packages show)
        str(Path(settings.BASE_DIR) / "var"),
        "/etc/shadow",
        "/root/.bashrc",
    ]
    database = db_connection.settings_dict["NAME"]
    if db_connection.vendor == "sqlite" and os.path.isfile(database):
        # World-readable on the host: only the sandbox keeps it from the server.
        targets.append(database)
    listings = [
        str(settings.XAGENT_WORKSPACES_DIR),
        str(settings.XAGENT_MCP_SERVERS_DIR),
        str(settings.BASE_DIR),
    ]

    results = in_one_session(
        hostile,
        [("read_file", {"path": path}) for path in targets] + [("list_dir", {"path": p}) for p in listings],
    )
    reads, (workspaces, servers, project) = results[: len(targets)], results[len(targets) :]

    for path, result in zip(targets, reads, strict=True):
        assert not result["ok"], f"the server read {path}: {result}"
        assert HOST_SECRET not in json.dumps(result)
    assert not workspaces["ok"] and not servers["ok"]
    # Of the project, only what leads to the paths the operator listed read-only exists (the
    # test package, and the venv's site-packages when the venv lives in the checkout, as in CI):
    # no var/, no database, no manage.py. A checkout the sandbox cannot reach (root, a private
    # directory) is bound as copies instead (config/sandbox_reach.py): then none of it exists.
    base = Path(settings.BASE_DIR)
    leading = sorted(
        {
            Path(p).relative_to(base).parts[0]
            for p in hostile.sandbox_read_paths
            if Path(p).is_relative_to(base)
        }
    )
    if sandbox_reach.out_of_reach(base / "tests"):
        assert not project["ok"] and not leading
    else:
        assert project == {"ok": True, "entries": leading}
        assert "tests" in leading and "var" not in leading


def test_a_server_cannot_write_outside_its_directory(hostile, other_servers_file):
    package_file = Path(settings.BASE_DIR) / "tests" / "hostile-was-here"
    targets = [
        str(other_servers_file),
        str(package_file),  # a read-only path of its own
        "/usr/hostile-was-here",
        "/etc/hostile-was-here",
        "/hostile-was-here",
    ]
    results = in_one_session(
        hostile,
        [("write_file", {"path": path}) for path in targets]
        + [("write_file", {"path": "/tmp/scratch"}), ("read_file", {"path": "/tmp/scratch"})],
    )

    for path, result in zip(targets, results[: len(targets)], strict=True):
        assert not result["ok"], f"the server wrote {path}"
        assert any(
            why in result["error"] for why in ("Read-only file system", "No such file", "Permission denied")
        )
    assert results[-1] == {"ok": True, "data": "hostile"}  # a private /tmp works
    assert other_servers_file.read_text() == HOST_SECRET
    assert not package_file.exists()
    assert not Path("/usr/hostile-was-here").exists() and not Path("/hostile-was-here").exists()


# --- network ----------------------------------------------------------------------------------


def test_the_network_is_off_until_an_operator_enables_it_for_the_server(hostile, listener):
    port, accepted = listener

    (refused,) = in_one_session(hostile, [("connect", {"host": "127.0.0.1", "port": port})])

    assert not refused["ok"]
    assert accepted == []

    hostile.network_enabled = True
    save_server(hostile, by_operator=True)
    (connected,) = in_one_session(hostile, [("connect", {"host": "127.0.0.1", "port": port})])

    assert connected == {"ok": True}
    assert len(accepted) == 1


def test_the_tenants_sandbox_policy_does_not_open_the_network(tenant_a, hostile, listener):
    """A tenant admin may edit the tenant's SandboxPolicy; its network flag is shell_exec's only."""
    port, accepted = listener
    SandboxPolicy.objects.create(tenant=tenant_a, name="open", is_default=True, network=True)

    (refused,) = in_one_session(hostile, [("connect", {"host": "127.0.0.1", "port": port})])

    assert not refused["ok"] and accepted == []


# --- limits and clean-up --------------------------------------------------------------------


@pytest.mark.skipif(not IS_ROOT, reason="process limits bind only once the chain drops to the sandbox uid")
def test_the_tenants_limits_bind_a_server_and_nothing_outlives_it(tenant_a, hostile):
    SandboxPolicy.objects.create(
        tenant=tenant_a, name="tight", is_default=True, memory_mb=384, max_processes=32
    )
    marker = f"hostile-{secrets.token_hex(6)}"
    stray = f"stray-{secrets.token_hex(6)}"

    small, big, flood, left, survivors = in_one_session(
        hostile,
        [
            ("alloc", {"mb": 32}),
            ("alloc", {"mb": 512}),
            ("fork_many", {"n": 200, "marker": marker}),
            ("leave_child", {"marker": stray}),
        ],
        while_connected=lambda: host_cmdlines_containing(stray.encode()),
    )

    assert small == {"ok": True, "mb": 32}
    assert big == {"ok": False, "error": "MemoryError"}  # RLIMIT_AS of the tenant's policy
    # RLIMIT_NPROC counts every process of the sandbox uid, this server's included.
    assert 0 < flood["started"] < 32 and flood["refused"] == 200 - flood["started"]
    # The stray child ran (a shell caught between its fork and the exec of sleep shows the marker
    # twice for a moment, so: at least one)...
    assert left == {"ok": True} and len(survivors) >= 1
    assert wait_for_no_process_with(stray) == []  # ...and went with the server
    assert wait_for_no_process_with(marker) == []


def test_secret_env_values_reach_the_server_but_no_host_command_line(tenant_a):
    secret = f"tok-{secrets.token_hex(8)}"
    set_secret(tenant_a, "TOKEN", secret)
    server = add_hostile(tenant_a, env={"HOSTILE_TOKEN": "{{secret:TOKEN}}"})

    seen, on_command_lines = in_one_session(
        server,
        [("env", {"name": "HOSTILE_TOKEN"})],
        while_connected=lambda: host_cmdlines_containing(secret.encode()),
    )

    assert seen == {"value": secret}
    assert on_command_lines == []


# --- where bwrap cannot run -----------------------------------------------------------------


@pytest.fixture
def broken_bwrap(mcp_servers_dir, monkeypatch) -> Path:
    """A 'bwrap' that fails the way a host without user namespaces makes the real one fail."""
    fake = mcp_servers_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox_process, "BWRAP", str(fake))
    return fake


def test_without_a_working_bwrap_the_server_is_refused_by_default(tenant_a, broken_bwrap):
    server = add_server(
        tenant_a, "toucher", MCPServer.Transport.STDIO, command="/bin/sh", args=["-c", "touch pwned; sleep 5"]
    )

    with pytest.raises(MCPError) as refused:
        refresh_server(server)

    message = str(refused.value)
    assert message.startswith("Could not start MCP server 'toucher': the process sandbox is unavailable")
    assert "No permissions to creating new namespace" in message and "fallback 'refuse'" in message
    assert not (server_directory(server) / "pwned").exists()


def test_the_rlimits_only_fallback_starts_the_server_unconfined_and_logs(
    tenant_a, hostile, broken_bwrap, caplog
):
    # Only an operator may allow running without namespaces.
    SandboxPolicy(tenant=tenant_a, name="lenient", is_default=True, fallback="rlimits_only").save(
        by_operator=True
    )

    with caplog.at_level(logging.WARNING, logger="tools_app.sandbox.server"):
        (me,) = in_one_session(hostile, [("whoami", {})])

    assert is_sandbox_identity(me["uid"], me["gid"])  # the uid drop and the limits still apply...
    assert me["cwd"] == me["home"] == str(server_directory(hostile))  # ...but no namespaces
    assert any("rlimits only" in record.getMessage() for record in caplog.records)


def test_a_tenant_admins_rlimits_only_fallback_is_not_honoured(tenant_a, hostile, broken_bwrap):
    SandboxPolicy.objects.create(tenant=tenant_a, name="lenient", is_default=True, fallback="rlimits_only")

    with pytest.raises(MCPError, match="fallback 'refuse'"):
        refresh_server(hostile)


def test_a_command_missing_from_the_sandbox_is_named(tenant_a):
    # The worker's own interpreter may live where the sandbox user cannot reach (e.g. under /root).
    server = add_server(tenant_a, "ghost", MCPServer.Transport.STDIO, command="/opt/not-bound/python")

    with pytest.raises(MCPError, match="the command '/opt/not-bound/python' was not found in its sandbox"):
        refresh_server(server)


WORKER = """
import json, subprocess, sys, time
launch = json.loads(sys.stdin.readline())
subprocess.Popen([launch["command"], *launch["args"]], env=launch["env"], cwd=launch["cwd"],
                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
print("spawned", flush=True)
time.sleep(120)
"""


def test_a_server_dies_with_the_worker_that_started_it(mcp_servers_dir):
    """As the SDK does it (its own process group, pipes), from a 'worker' that is then SIGKILLed."""
    marker = f"orphan-{secrets.token_hex(6)}"
    directory = mcp_servers_dir / "server"
    directory.mkdir()
    launch = prepare_server(
        "/bin/sh", ["-c", "sleep 120 & sleep 120", marker], {}, ServerSandbox(str(directory), DEFAULT_LIMITS)
    )
    assert launch.sandboxed
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        worker.stdin.write(json.dumps(dataclasses.asdict(launch)) + "\n")
        worker.stdin.flush()
        assert worker.stdout.readline().strip() == "spawned"
        deadline = time.monotonic() + 30
        # The sandboxed shell (uid 65534 when root) is up once it shows on the host's process list.
        while len(host_cmdlines_containing(marker.encode())) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(host_cmdlines_containing(marker.encode())) >= 3  # bwrap, the sandbox's pid 1, the server
    finally:
        worker.kill()
        worker.wait()

    assert wait_for_no_process_with(marker) == []
