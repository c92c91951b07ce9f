"""`make run` works from a checkout in a private directory, as root (issue #31).

A fresh clone of this repository's HEAD in a `mktemp -d` folder (0700: the sandbox uids cannot
search it), with this run's venv hard-linked in (no install, and its site-packages private too,
as after `make` in such a clone), no database or sandbox setting in the environment. From it:
`manage.py migrate`, a tenant, the example stdio MCP server added with `--python-module` (its
refresh starts it sandboxed), then `runstack` with its in-process worker and a Session turn that
runs `shell_exec` and the example server's `echo`, both in the sandbox. Everything the sandbox
needs lies in the clone's sandbox data directory (config/sandbox_reach.py), which the banner
names; nothing of the clone's directories changes mode.

The clone is HEAD: commit before running this on a change.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2 as httpx
import pytest

from config import sandbox_reach
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.sandbox import process as sandbox_process

from .processes import free_port, wait_for_http

PROJECT_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.timeout(600),  # a clone, a migrate and a dozen process starts, on a busy runner
    pytest.mark.skipif(os.geteuid() != 0, reason="only a root process drops to the sandbox uids"),
    pytest.mark.skipif(
        not os.access(sandbox_process.BWRAP, os.X_OK),
        reason=f"bubblewrap is not installed at {sandbox_process.BWRAP} (CI installs it)",
    ),
    pytest.mark.skipif(
        shutil.which("git") is None or not (PROJECT_ROOT / ".git").exists(),
        reason="needs git and a git checkout to clone",
    ),
]

# Nothing of this run's configuration reaches the clone: it starts as `make run` would.
_NOT_PASSED = {
    "DATABASE_URL",
    "REDIS_URL",
    "SECRET_KEY",
    "ALLOWED_HOSTS",
    "DJANGO_SETTINGS_MODULE",
    "PYTHONPATH",
}


@pytest.fixture
def clone():
    top = Path(tempfile.mkdtemp(prefix="xagent-private-"))
    checkout = top / "xagent"
    try:
        subprocess.run(["git", "clone", "--quiet", str(PROJECT_ROOT), str(checkout)], check=True, timeout=120)
        yield checkout
    finally:
        shutil.rmtree(sandbox_reach.default_data_dir(checkout), ignore_errors=True)
        shutil.rmtree(top, ignore_errors=True)


def python_in(checkout: Path) -> str:
    """This run's venv hard-linked into the checkout (a symlink where links cannot be made);
    this interpreter itself when it is not a venv's."""
    venv = Path(sys.prefix)
    if venv == Path(sys.base_prefix):
        return sys.executable
    try:
        shutil.copytree(venv, checkout / ".venv", symlinks=True, copy_function=os.link)
    except OSError:
        shutil.rmtree(checkout / ".venv", ignore_errors=True)
        (checkout / ".venv").symlink_to(venv)
    return str(checkout / ".venv" / "bin" / "python")


@contextmanager
def served(
    python: str, checkout: Path, env: dict[str, str], port: int, log: Path
) -> Iterator[subprocess.Popen]:
    """`manage.py runstack` of the checkout, stopped (SIGTERM, then SIGKILL) when the block ends."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [python, "manage.py", "runstack", "--port", str(port)],
            cwd=checkout,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def modes_of(path: Path) -> dict[str, int]:
    """The mode of `path` and of every directory above it."""
    return {str(p): stat.S_IMODE(os.stat(p).st_mode) for p in [path, *path.parents]}


def test_make_run_from_a_private_checkout_as_root_runs_the_sandbox(clone, model_server, tmp_path):
    python = python_in(clone)
    env = {k: v for k, v in os.environ.items() if k not in _NOT_PASSED and not k.startswith("XAGENT_")}
    env["PYTHONUNBUFFERED"] = "1"
    modes_before = modes_of(clone)
    assert sandbox_reach.unsearchable_parent(clone / "var" / "workspaces") == clone.parent

    def manage(*args: str) -> str:
        done = subprocess.run(
            [python, "manage.py", *args], cwd=clone, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def shell(code: str) -> str:
        return manage("shell", "-v", "0", "-c", code)

    manage("migrate", "--noinput", "-v0")
    manage("create_tenant", "acme")
    manage("create_user", "owner", "--tenant", "acme", "--role", "owner", "--password", "owner-pass-1")
    key = manage("create_api_key", "--tenant", "acme", "--user", "owner").strip()
    # The command docs/tools-and-mcp.md gives for the example server; its refresh starts it in the sandbox.
    tools = manage(
        "mcp_server", "add", "example", "--tenant", "acme", "--python-module", "tools_app.mcp.example_server"
    )
    assert "example__echo" in tools.split()
    shell(
        "from sessions_app.models import ModelConfig; from tenancy_app.models import Tenant; "
        "ModelConfig.objects.create(tenant=Tenant.objects.get(slug='acme'), name='scripted', "
        f"base_url={model_server.base_url!r}, model='scripted-model', context_window=32000, "
        "max_output_tokens=1024, is_default=True, configured_by_operator=True)"
    )
    model_server.script(
        "agent",
        tool_reply(
            [
                tool_call("shell_exec", {"command": "echo made in the sandbox > made.txt; id -u"}, id="sh"),
                tool_call("example__echo", {"text": "hello from the example server"}, id="mcp"),
            ]
        ),
        text_reply("Both ran."),
    )

    port = free_port()
    log = tmp_path / "runstack.log"
    with served(python, clone, env, port, log) as stack:
        health = wait_for_http(f"http://127.0.0.1:{port}/healthz?worker=1", stack, log)
        assert health.json()["worker"] == "ok"
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as api:
            session_id = api.post("/sessions/", json={"title": "private checkout"}).json()["id"]
            shell(
                "from sessions_app.runtime import engine; "
                f"engine.add_selected_capabilities({session_id!r}, None, "
                "tools=['shell_exec', 'example__echo'], added_by='test')"
            )
            assert api.post(f"/sessions/{session_id}/inputs/", json={"text": "run both"}).status_code == 202
            events = []
            deadline = time.monotonic() + 120
            while not any(e["type"] == "turn.ended" for e in events):
                assert time.monotonic() < deadline, f"no turn.ended: {events[-5:]}\n{log.read_text()}"
                body = api.get(f"/sessions/{session_id}/events/", params={"after": len(events), "wait": 2})
                events += body.json()["events"]
                for event in body.json()["events"]:
                    if event["type"] == "approval.requested":  # shell_exec asks a person first
                        approval = event["data"]["approval_id"]
                        decided = api.post(f"/approvals/{approval}/decide/", json={"decision": "approve"})
                        assert decided.status_code == 200, decided.text
    banner = log.read_text()

    found = json.loads(
        shell(
            "import json; from django.conf import settings; from sessions_app.models import Message; "
            "print(json.dumps({'workspaces': str(settings.XAGENT_WORKSPACES_DIR), 'results': {m.tool_call_id: "
            f"m.content for m in Message.objects.filter(session_id={session_id!r}, role='tool')}}}}))"
        )
    )
    results, workspaces = found["results"], Path(found["workspaces"])
    data_dir = sandbox_reach.default_data_dir(clone)
    assert [e["data"]["reason"] for e in events if e["type"] == "turn.ended"] == ["completed"]
    assert "hello from the example server" in results["mcp"], results
    ran = re.match(r"exit code: 0 \(took [^)]*\)\nstdout:\n(\d+)\n", results["sh"])
    assert ran and int(ran.group(1)) != 0, results["sh"]  # in the sandbox, as a sandbox uid
    assert workspaces == data_dir / "workspaces"
    assert [p.read_text() for p in workspaces.glob(f"*/{session_id}/made.txt")] == ["made in the sandbox\n"]
    assert f"Sandbox data: Session workspaces in {workspaces}" in banner, banner
    assert f"cannot search {clone.parent}" in banner, banner
    assert modes_of(clone) == modes_before  # the owner's directories are as they were
