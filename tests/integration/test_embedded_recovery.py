"""Issue #11 in embedded mode: `manage.py runstack` on SQLite (in-process worker, no beat) is
killed (SIGKILL) while a model answer streams; a new runstack on the same database takes the
turn over — its start-up or timer sweep finds the dead process's lease holder gone — and the
turn completes. The lease is 600 s, so its lapsing cannot explain the takeover.

(a) is the first test; (b)-(e) share one SIGKILL of a stack running four Sessions, each at its
own kill point, and one restart. They check outcomes through the REST API only."""

import json
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.support.model_server import text_reply

from .processes import embedded_env, free_port, manage, migrate_embedded, running, wait_for_http

PASSWORD = "recovery-pass-123"


def _stack_env(tmp_path, model_server) -> dict[str, str]:
    env = embedded_env(tmp_path)
    env.update(
        OPENAI_BASE_URL=model_server.base_url,
        OPENAI_API_KEY="test-key",
        XAGENT_MODEL="scripted-model",
        XAGENT_RUNNER_LEASE_SECONDS="600",
    )
    return env


def _events(api, session_id) -> list[dict]:
    return api.get(f"/sessions/{session_id}/events/").json()["events"]


@contextmanager
def killed_and_restarted(tmp_path, model_server):
    """An embedded install whose runstack is SIGKILLed while the first turn's answer streams,
    then started again on the same database. Yields (base URL, API key, session id) once the
    restarted stack has ended that turn."""
    model_server.script(
        "agent",
        text_reply("slow " * 400, chunk_size=5, delay_per_chunk_s=0.05),  # killed in here
        text_reply("Resumed and finished."),
    )
    env = _stack_env(tmp_path, model_server)
    migrate_embedded(env)
    manage(env, "create_tenant", "acme")
    manage(env, "create_user", "alice", "--tenant", "acme", "--role", "owner", "--password", PASSWORD)
    key = manage(env, "create_api_key", "--tenant", "acme", "--user", "alice").stdout.strip()
    headers = {"Authorization": f"Bearer {key}"}

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "manage.py", "runstack", "--port", str(port)]
    with running(command, env, tmp_path / "first.log") as first:
        wait_for_http(f"{base}/healthz", first, tmp_path / "first.log")
        with httpx.Client(base_url=f"{base}/api/v1", headers=headers, timeout=30) as api:
            session_id = api.post("/sessions/", json={"title": "embedded crash"}).json()["id"]
            assert api.post(f"/sessions/{session_id}/inputs/", json={"text": "go"}).status_code == 202
            model_server.wait_for_requests(1, timeout=60)  # the answer is streaming
        first.kill()
        first.wait(timeout=10)

    with running(command, env, tmp_path / "second.log") as second:
        wait_for_http(f"{base}/healthz", second, tmp_path / "second.log")
        with httpx.Client(base_url=f"{base}/api/v1", headers=headers, timeout=30) as api:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                if any(e["type"] == "turn.ended" for e in _events(api, session_id)):
                    break
                time.sleep(0.2)
        yield base, key, session_id


def test_a_killed_embedded_stack_resumes_the_turn_after_a_restart(tmp_path, model_server):
    with killed_and_restarted(tmp_path, model_server) as (base, key, session_id):
        with httpx.Client(
            base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as api:
            events = _events(api, session_id)
            messages = api.get(f"/sessions/{session_id}/messages/").json()
            session = api.get(f"/sessions/{session_id}/").json()

    ended = [e["data"] for e in events if e["type"] == "turn.ended"]
    assert [e["reason"] for e in ended] == ["completed"], (tmp_path / "second.log").read_text()
    recovered = [e["data"] for e in events if e["type"] == "session.recovered"]
    assert len(recovered) == 1 and len(recovered[0]["interrupted_model_calls"]) == 1
    assert recovered[0]["next"] == "the turn continues with step 1"
    rows = messages["results"] if isinstance(messages, dict) else messages
    assert [(m["role"], m["content"]) for m in rows] == [
        ("user", "go"),
        ("assistant", "Resumed and finished."),
    ]
    assert session["status"] == "idle"
    assert len(model_server.requests_for("agent")) == 2


# --- (b) to (e): one SIGKILL, four Sessions, each at its own kill point ------------------------

# One `manage.py shell` (each manage.py start costs seconds): what create_tenant, create_user
# and create_api_key do, then tenant "ops" (shell tool set, approvals off: (b), (c)) and tenant
# "acme" (default approval policy, fs_delete_files: (e); a small-window model "small": (d)).
SETUP = """
import json
from approvals_app.models import ApprovalPolicy
from approvals_app.policy import ensure_default_policy
from sessions_app.models import ModelConfig
from tenancy_app.actions import do_create_tenant, do_create_user, do_issue_api_key
from tenancy_app.models import Tenant
from tools_app.models import Tool, ToolSet

keys = {{}}
for slug, username in (("ops", "olga"), ("acme", "alice")):
    tenant, _ = do_create_tenant(slug)
    user, _ = do_create_user(username, tenant, role="owner", password="{password}")
    keys[slug] = do_issue_api_key(tenant, user, "recovery test")[1]
ops, acme = Tenant.objects.get(slug="ops"), Tenant.objects.get(slug="acme")
shell = ToolSet.objects.create(tenant=ops, name="shell", is_default=True)
shell.tools.add(Tool.objects.get(tenant=None, name="shell_exec"))
ensure_default_policy(ops)
ApprovalPolicy.objects.filter(tenant=ops).update(enabled=False)  # no approval stop for (b), (c)
cleanup = ToolSet.objects.create(tenant=acme, name="cleanup", is_default=True)
cleanup.tools.add(Tool.objects.get(tenant=None, name="fs_delete_files"))  # approval required
ModelConfig.objects.create(
    tenant=acme, name="small", base_url="{base_url}", model="scripted-model",
    context_window={window}, max_output_tokens={max_output}, configured_by_operator=True,
)
print(json.dumps({{"keys": keys, "tenants": {{"ops": ops.pk, "acme": acme.pk}}}}))
"""


def _all_events(api, session_id) -> list[dict]:
    events, after = [], 0
    while True:
        page = api.get(f"/sessions/{session_id}/events/", params={"after": after}).json()
        if not page["events"]:
            return events
        events += page["events"]
        after = page["events"][-1]["seq"]


def _all_messages(api, session_id) -> list[dict]:
    rows, url = [], f"/sessions/{session_id}/messages/"
    while url:
        page = api.get(url).json()
        if isinstance(page, list):
            return page
        rows += page["results"]
        url = page.get("next")
    return rows


def _assert_tool_pairs(messages) -> None:
    """Every assistant tool call is followed by exactly its results, each once."""
    for index, message in enumerate(messages):
        ids = [call["id"] for call in message.get("tool_calls") or []]
        if ids:
            answered = [m.get("tool_call_id") for m in messages[index + 1 : index + 1 + len(ids)]]
            assert answered == ids, (index, ids, answered)
    results = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert len(results) == len(set(results))


def _ended(events) -> list[str]:
    return [e["data"]["reason"] for e in events if e["type"] == "turn.ended"]


class Scenarios:
    """The model for all four Sessions of the stack: each answers by the scenario its user
    message names ("scenario b: ..."); the kill points are set as the server reaches them."""

    def __init__(self, files: int):
        import threading

        self.files = files
        self.lock = threading.Lock()
        self.b_streaming = threading.Event()  # (b): the step after the committed result is open
        self.d_summarizing = threading.Event()  # (d): the summary call is in flight

    @staticmethod
    def _scenario(request) -> str:
        first = next(m["content"] for m in request.messages if m["role"] == "user")
        return first.split(":")[0].removeprefix("scenario ")

    def agent(self, request):
        from tests.support.model_server import tool_call, tool_reply

        scenario = self._scenario(request)
        results = [m["tool_call_id"] for m in request.messages if m["role"] == "tool"]
        if scenario == "b":
            if not results:
                return tool_reply(tool_call("shell_exec", {"command": "echo run >> runs.log"}, id="b1"))
            with self.lock:
                first_time = not self.b_streaming.is_set()
                self.b_streaming.set()
            if first_time:
                return text_reply("never finished", delay_before_s=300)  # killed in here
            return text_reply("B done.")
        if scenario == "c":
            if not results:
                command = {"command": "echo run >> runs.log; sleep 50", "timeout_seconds": 60}
                return tool_reply(tool_call("shell_exec", command, id="c1"))  # killed in here
            return text_reply("C done.")
        if scenario == "d":
            read = [int(r[1:]) for r in results if r.startswith("d")]
            index = max(read) + 1 if read else 0
            if index < self.files:
                return tool_reply(tool_call("fs_read", {"path": f"notes_{index:02}.txt"}, id=f"d{index}"))
            return text_reply("D done: notes_17.txt mentions the blue heron.")
        if scenario == "e":
            if not results:
                return tool_reply(tool_call("fs_delete_files", {"paths": ["draft.md"]}, id="e1"))
            return text_reply("E done.")
        raise AssertionError(f"unknown scenario {scenario!r}")

    def summary(self, request):
        from tests.runtime.test_compaction import valid_state
        from tests.support.model_server import json_reply

        with self.lock:
            first_time = not self.d_summarizing.is_set()
            self.d_summarizing.set()
        return json_reply(valid_state(), delay_before_s=300 if first_time else 0)  # killed in here


def _wait(predicate, what: str, log, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text(errors='replace')[-5000:]}")


@pytest.fixture
def searchable_workspaces():
    """Workspaces the shell sandbox's uid can reach (pytest's tmp_path parents are 0700)."""
    root = Path(tempfile.mkdtemp(prefix="xagent-embedded-kills-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_b_to_e_a_killed_embedded_stack_recovers_each_kill_point_after_a_restart(
    tmp_path, model_server, searchable_workspaces
):
    """(b) after a side-effecting call's result committed: never re-run; (c) a non-idempotent
    call dispatched, result uncommitted: an `interrupted` result, not re-run; (d) a pending
    compaction: discarded (its summary was never validated), redone, the history consistent;
    (e) waiting for approval: still waiting, and the decision completes the turn."""
    from tests.runtime.test_compaction import FILES, MAX_OUTPUT, WINDOW

    model = Scenarios(FILES)
    model_server.default("agent", model.agent)
    model_server.default("summary", model.summary)
    env = _stack_env(tmp_path, model_server)
    env["XAGENT_EMBEDDED_WORKER_THREADS"] = "6"
    env["XAGENT_WORKSPACES_DIR"] = str(searchable_workspaces)
    migrate_embedded(env)
    setup = SETUP.format(
        password=PASSWORD, base_url=model_server.base_url, window=WINDOW, max_output=MAX_OUTPUT
    )
    made = json.loads(manage(env, "shell", "-c", setup).stdout.strip().splitlines()[-1])
    keys, tenant_pks = made["keys"], made["tenants"]
    workspaces = searchable_workspaces

    def client(base, tenant):
        return httpx.Client(
            base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {keys[tenant]}"}, timeout=30
        )

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "manage.py", "runstack", "--port", str(port)]
    tenant_of = {"b": "ops", "c": "ops", "d": "acme", "e": "acme"}
    ids, workspace = {}, {}
    first_log = tmp_path / "first.log"
    with running(command, env, first_log) as first:
        wait_for_http(f"{base}/healthz", first, first_log)
        for scenario, tenant in tenant_of.items():
            with client(base, tenant) as api:
                body = {"title": f"kill point {scenario}", **({"model": "small"} if scenario == "d" else {})}
                response = api.post("/sessions/", json=body)
                assert response.status_code == 201, response.text
                ids[scenario] = response.json()["id"]
            workspace[scenario] = workspaces / str(tenant_pks[tenant]) / ids[scenario]
            workspace[scenario].mkdir(parents=True, exist_ok=True)
        for index in range(FILES):
            line = f"Notes file {index}: " + ("the blue heron" if index == 17 else "nothing of note")
            (workspace["d"] / f"notes_{index:02}.txt").write_text((line + " — padding text.\n") * 30)
        (workspace["e"] / "draft.md").write_text("scratch")
        texts = {
            "b": "scenario b: append a line to runs.log",
            "c": "scenario c: append a line to runs.log, then wait",
            "d": "scenario d: read every notes file and tell me which one mentions the blue heron",
            "e": "scenario e: delete draft.md",
        }
        for scenario, text in texts.items():
            with client(base, tenant_of[scenario]) as api:
                sent = api.post(f"/sessions/{ids[scenario]}/inputs/", json={"text": text})
                assert sent.status_code == 202, sent.text

        with client(base, "acme") as api:
            _wait(
                lambda: api.get(f"/sessions/{ids['e']}/").json()["status"] == "waiting_approval",
                "(e) to wait for approval",
                first_log,
            )
        _wait(model.b_streaming.is_set, "(b) to stream the step after its result", first_log)
        _wait((workspace["c"] / "runs.log").exists, "(c) to start its command", first_log)
        _wait(model.d_summarizing.is_set, "(d) to start its summary call", first_log)
        first.kill()  # SIGKILL: no cleanup, every lease stays taken
        first.wait(timeout=10)
    summary_calls_before = len(model_server.requests_for("summary"))
    assert summary_calls_before == 1

    second_log = tmp_path / "second.log"
    with running(command, env, second_log) as second:
        wait_for_http(f"{base}/healthz", second, second_log)
        events = {}
        for scenario in "bcd":
            with client(base, tenant_of[scenario]) as api:
                _wait(
                    lambda api=api, s=scenario: _ended(_all_events(api, ids[s])),
                    f"({scenario}) to end its turn",
                    second_log,
                )
                events[scenario] = _all_events(api, ids[scenario])
        with client(base, "acme") as api:
            # (e) still waits: nothing moved it, and its file is untouched.
            session_e = api.get(f"/sessions/{ids['e']}/").json()
            pending = api.get(f"/sessions/{ids['e']}/approvals/", params={"status": "pending"}).json()
            pending = pending["results"] if isinstance(pending, dict) else pending
            assert session_e["status"] == "waiting_approval", session_e
            assert len(pending) == 1 and pending[0]["tool"] == "fs_delete_files"
            assert (workspace["e"] / "draft.md").exists()
            assert not _ended(_all_events(api, ids["e"]))
            decided = api.post(f"/approvals/{pending[0]['id']}/decide/", json={"decision": "approve"})
            assert decided.status_code == 200, decided.text
            _wait(lambda: _ended(_all_events(api, ids["e"])), "(e) to end its turn", second_log)
            events["e"] = _all_events(api, ids["e"])
        messages = {}
        for scenario, tenant in tenant_of.items():
            with client(base, tenant) as api:
                messages[scenario] = _all_messages(api, ids[scenario])
                assert api.get(f"/sessions/{ids[scenario]}/").json()["status"] == "idle"

    log = second_log.read_text(errors="replace")
    for scenario in "bcde":
        assert _ended(events[scenario]) == ["completed"], (scenario, log[-5000:])
        _assert_tool_pairs(messages[scenario])

    def recovered(scenario) -> list[dict]:
        return [e["data"] for e in events[scenario] if e["type"] == "session.recovered"]

    # (b) the committed call is kept and never re-run; the open model call is asked again.
    assert (workspace["b"] / "runs.log").read_text().splitlines() == ["run"]
    assert [(m["role"], m["tool_call_id"]) for m in messages["b"]] == [
        ("user", ""),
        ("assistant", ""),
        ("tool", "b1"),
        ("assistant", ""),
    ]
    assert messages["b"][-1]["content"] == "B done."
    (found,) = recovered("b")
    assert len(found["interrupted_model_calls"]) == 1 and found["interrupted_calls"] == []
    assert found["rerun_calls"] == []

    # (c) the dispatched call gets an `interrupted` result and is not run again.
    assert (workspace["c"] / "runs.log").read_text().splitlines() == ["run"]
    (result,) = [m for m in messages["c"] if m["role"] == "tool"]
    assert result["tool_call_id"] == "c1" and result["content"].startswith("Interrupted:")
    assert messages["c"][-1]["content"] == "C done."
    (found,) = recovered("c")
    assert found["interrupted_calls"] == [
        {"call_id": "c1", "tool": "shell_exec", "reason": "runner lost before its result"}
    ]
    assert found["rerun_calls"] == []

    # (d) the pending compaction (summary never validated) is discarded, then redone.
    started = [e["data"]["checkpoint_id"] for e in events["d"] if e["type"] == "compaction.started"]
    committed = [e["data"] for e in events["d"] if e["type"] == "compaction.committed"]
    (found,) = recovered("d")
    assert any(line.startswith(f"compaction {started[0]} discarded") for line in found["restored"]), found
    assert committed and started[0] not in [c["checkpoint_id"] for c in committed]
    assert all(c["method"] == "summary" for c in committed)
    assert len(model_server.requests_for("summary")) == len(started) == len(committed) + 1
    reads = [m["tool_call_id"] for m in messages["d"] if m["role"] == "tool"]
    assert reads == [f"d{index}" for index in range(FILES)]  # each read once, in order
    assert messages["d"][-1]["content"].startswith("D done")

    # (e) the approved call ran once, after the restart.
    assert not (workspace["e"] / "draft.md").exists()
    assert [m["tool_call_id"] for m in messages["e"] if m["role"] == "tool"] == ["e1"]
    assert messages["e"][-1]["content"] == "E done."
