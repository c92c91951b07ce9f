"""Issue #25's sandbox attacks, replayed on the production path (a real Celery worker over Redis,
PostgreSQL, the real agent loop with the scripted model, real bwrap), each refused:

1. host network from a tenant setting: a tenant admin's policy "network on" (its POST also
   carrying the operator-only `fallback` and `host_network`) gives a member's `shell_exec`
   egress to an allow-listed public stand-in, but not PostgreSQL, Redis or the app's port;
2. the rlimits-only fallback forced by a process flood in another Session: the flood holds its
   processes while another Session's command runs, sandboxed;
4. the flood does not stop the other Session's `shell_exec` at all (a uid each).
"""

from __future__ import annotations

import json
import os
import socket
import time
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.test import Client

from approvals_app.models import ApprovalPolicy
from approvals_app.policy import ensure_default_policy
from sessions_app.models import Message, Turn
from tests.support.model_server import text_reply, tool_call, tool_reply
from tests.support.public_stand_in import STAND_IN, public_stand_in
from tools_app.models import SandboxPolicy, Tool, ToolSet
from tools_app.sandbox import egress
from tools_app.sandbox import process as sandbox_process

from .processes import database_env_for_workers, running, worker_command

pytestmark = [
    pytest.mark.services,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.access(sandbox_process.BWRAP, os.X_OK), reason="bubblewrap is not installed"),
    pytest.mark.skipif(not os.access(egress.PYTHON, os.X_OK), reason=f"{egress.PYTHON} is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a uid per sandbox needs a root worker"),
]


@pytest.fixture
def stand_in():
    with public_stand_in() as port:
        yield port


@pytest.fixture
def shell_tenant(tenant_a):
    shell = ToolSet.objects.create(tenant=tenant_a, name="shell", is_default=True)
    shell.tools.add(Tool.objects.get(tenant=None, name="shell_exec"))
    ensure_default_policy(tenant_a)
    ApprovalPolicy.objects.filter(tenant=tenant_a).update(enabled=False)
    return tenant_a


def wait_for(predicate, what: str, worker, log, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert worker.poll() is None, log.read_text(errors="replace")[-4000:]
        time.sleep(0.1)
    raise AssertionError(
        f"timed out waiting for {what}; worker log:\n{log.read_text(errors='replace')[-4000:]}"
    )


def by_session_text(commands: dict[str, str]):
    """A model that, for the user message naming a key of `commands`, runs that command once and
    then answers with the command's output (so each Session's turn is its own)."""

    def reply(request):
        messages = request.body["messages"]
        last = messages[-1]
        if last["role"] == "tool":
            return text_reply("done: " + last["content"][:2000])
        user = next(m for m in reversed(messages) if m["role"] == "user")
        text = user["content"] if isinstance(user["content"], str) else json.dumps(user["content"])
        key = next(k for k in commands if k in text)
        return tool_reply([tool_call("shell_exec", {"command": commands[key]}, id=f"call-{key}")])

    return reply


def start_session(api, title: str, text: str) -> str:
    session_id = api.post("/api/v1/sessions/", {"title": title}, format="json").json()["id"]
    answer = api.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": text}, format="json")
    assert answer.status_code == 202, answer.content
    return session_id


def tool_result(session_id: str) -> Message:
    return Message.objects.get(session_id=session_id, role="tool")


def flood_holds_processes() -> bool:
    """Some sandbox uid has over 20 live processes on the host."""
    low, high = settings.XAGENT_SANDBOX_UIDS
    counts: dict[int, int] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status", "rb") as fh:
                uid = int(next(line for line in fh if line.startswith(b"Uid:")).split()[1])
        except (OSError, StopIteration, ValueError):
            continue
        if low <= uid <= high:
            counts[uid] = counts.get(uid, 0) + 1
    return any(n > 20 for n in counts.values())


def turn_ended(session_id: str) -> bool:
    return Turn.objects.filter(session_id=session_id).exclude(reason="").exists()


def test_a_tenant_policy_with_network_reaches_public_hosts_only(
    tmp_path, shell_tenant, owner_a, api_member_a, model_config_a, model_server, stand_in
):
    # The tenant admin's policy, through Django admin, trying every operator-only field too.
    admin = Client()
    admin.force_login(owner_a)
    answer = admin.post(
        "/admin/tools_app/sandboxpolicy/add/",
        {
            "tenant": shell_tenant.pk,
            "name": "open",
            "filesystem": "workspace_write",
            "network": "on",
            "host_network": "on",
            "fallback": "rlimits_only",
            "cpu_seconds": 30,
            "memory_mb": 1024,
            "wall_seconds": 60,
            "max_processes": 64,
            "max_file_size_mb": 50,
            "max_output_bytes": 200000,
            "is_default": "on",
        },
    )
    assert answer.status_code == 302, answer.content.decode()[:2000]
    policy = SandboxPolicy.objects.get(tenant=shell_tenant, name="open")
    assert policy.network and not policy.host_network and policy.fallback == "refuse"

    db = settings.DATABASES["default"]
    redis = urlsplit(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    app = socket.socket()  # stands for the web app's port on the host
    app.bind(("127.0.0.1", 0))
    app.listen(8)
    app.settimeout(0.5)
    targets = {
        "postgres": (db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)),
        "redis": (redis.hostname or "127.0.0.1", redis.port or 6379),
        "app": app.getsockname(),
    }
    probe = f"curl -sS http://{STAND_IN}:{stand_in}/; " + "".join(
        f"curl -s -w '|%{{http_code}}\\n' http://{host}:{port}/; "
        f"python3 -c \"import socket; socket.create_connection(('{host}', {port}), timeout=3)\" 2>&1 | tail -n 1; "
        for host, port in targets.values()
    )
    model_server.default("agent", by_session_text({"probe": probe}))
    env = {
        **database_env_for_workers(),
        "XAGENT_OUTBOUND_ALLOWED_HOSTS": STAND_IN,
        # The real services' ports are open for egress here, so it is the guard that refuses them.
        "XAGENT_SANDBOX_EGRESS_PORTS": ",".join(["80", "443", *(str(p) for _, p in targets.values())]),
    }
    log = tmp_path / "worker.log"
    with running(worker_command("net"), env, log) as worker:
        session_id = start_session(api_member_a, "network", "probe the network")
        wait_for(lambda: turn_ended(session_id), "the turn", worker, log)

    result = tool_result(session_id).content
    assert "hello from the public stand-in" in result
    assert result.count("|403") == 3, result  # PostgreSQL, Redis and the app through the proxy
    assert result.count("resolves to a loopback address") == 3, result
    assert result.count("ConnectionRefusedError") == 3, result  # and directly: nothing there
    with pytest.raises(OSError):  # the app's listener never saw a connection
        app.accept()
    app.close()
    assert "ran WITHOUT the namespace sandbox" not in result


def test_a_process_flood_in_one_session_neither_stops_nor_unconfines_another(
    tmp_path, shell_tenant, api_owner_a, api_member_a, model_config_a, model_server
):
    # A tenant row that says rlimits_only (as before the migration): never honoured for a tenant.
    SandboxPolicy.objects.create(
        tenant=shell_tenant, name="lenient", is_default=True, fallback="rlimits_only", max_processes=64
    )
    other_workspace = "/workspace"
    commands = {
        # dash gives up at the first fork that fails; the sleeps it started stay, held.
        "flood": "(for i in $(seq 1 200); do sleep 20 & echo started; done) >/dev/null; echo held; exec sleep 15",
        "probe": f"id -u; ls -d {other_workspace}; ls /; cat /proc/self/status | grep -c NSpid",
    }
    model_server.default("agent", by_session_text(commands))
    log = tmp_path / "worker.log"
    with running(worker_command("flood"), database_env_for_workers(), log) as worker:
        flooding = start_session(api_owner_a, "flood", "flood the process table")
        wait_for(
            lambda: (
                Message.objects.filter(session_id=flooding, role="assistant").exists()
                and model_server.requests_for("agent")
            ),
            "the flood to start",
            worker,
            log,
        )
        wait_for(flood_holds_processes, "the flood to hold its processes", worker, log)
        probes = [start_session(api_member_a, f"probe {n}", "probe the sandbox") for n in range(2)]
        for probe in probes:
            wait_for(lambda probe=probe: turn_ended(probe), "a probe's turn", worker, log)
        flood_running = not turn_ended(flooding)
        wait_for(lambda: turn_ended(flooding), "the flood's turn", worker, log)

    assert flood_running  # the probes ran while the flood held its processes
    flood_result = tool_result(flooding)
    for probe in probes:
        message = tool_result(probe)
        assert not message.is_error, message.content
        assert "ran WITHOUT the namespace sandbox" not in message.content
        assert "Cannot fork" not in message.content and "Resource temporarily" not in message.content
        lines = message.content.split("stdout:", 1)[1].split("stderr:", 1)[0].split()
        assert lines[1] == "/workspace"  # inside its own mount namespace
        assert "work" not in lines  # the host's tree (/work, /root...) is not there
    assert "exit code" in flood_result.content
