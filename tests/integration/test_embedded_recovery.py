"""Issue #11 in embedded mode: `manage.py runstack` on SQLite (in-process worker, no beat) is
killed (SIGKILL) while a model answer streams; a new runstack on the same database takes the
turn over — its start-up or timer sweep finds the dead process's lease holder gone — and the
turn completes. The lease is 600 s, so its lapsing cannot explain the takeover."""

import sys
import time
from contextlib import contextmanager

import httpx2 as httpx

from tests.support.model_server import text_reply

from .processes import embedded_env, free_port, manage, running, wait_for_http

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
    manage(env, "migrate", "--noinput", "-v0")
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
