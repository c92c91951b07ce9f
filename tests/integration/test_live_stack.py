"""Live streams on real processes: daphne (runstack) + a Celery worker + Redis channel layer +
PostgreSQL, a real WebSocket client, and the scripted model server on loopback."""

import hashlib
import json
import sys

import httpx2 as httpx
import pytest
from websockets.sync.client import connect

from sessions_app.models import ModelCall, SessionEvent, Turn
from tests.support.model_server import text_reply, tool_call, tool_reply

from .processes import database_env_for_workers, free_port, running, wait_for_port, web_and_worker

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(tmp_path):
    """Web (daphne via runstack, web only with REDIS_URL) and one worker, on the test database."""
    with web_and_worker(tmp_path) as address:
        yield address


def _api(stack, key):
    return httpx.Client(
        base_url=f"http://{stack}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def _frames_until(ws, predicate, limit=2000):
    frames = []
    for _ in range(limit):
        frame = json.loads(ws.recv(timeout=30))
        frames.append(frame)
        if predicate(frame):
            return frames
    raise AssertionError(f"no matching frame in {limit}: {frames[-5:]}")


def test_websocket_reconnect_gives_every_event_once_in_order(
    stack, api_owner_a, model_config_a, model_server
):
    model_server.script(
        "agent",
        tool_reply(
            [tool_call("fs_write", {"path": "a.txt", "content": "a"})],
            text="Writing a.txt now.",
            delay_per_chunk_s=0.02,
            chunk_size=4,
        ),
        text_reply("Done writing a.txt, all good. " * 4, chunk_size=6, delay_per_chunk_s=0.03),
    )
    key = api_owner_a.api_key
    with _api(stack, key) as api:
        session_id = api.post("/sessions/", json={"title": "live"}).json()["id"]
        url = f"ws://{stack}/ws/sessions/{session_id}/?token={key}"
        with connect(url) as ws:
            assert (
                api.post(f"/sessions/{session_id}/inputs/", json={"text": "write a.txt"}).status_code == 202
            )
            first = _frames_until(ws, lambda f: f["type"] == "tool.ended")
        logged_first = [f for f in first if f["seq"] is not None]
        last_seen = logged_first[-1]["seq"]
        with connect(f"{url}&after={last_seen}") as ws:
            second = _frames_until(ws, lambda f: f["type"] == "turn.ended")

    seqs = [f["seq"] for f in logged_first] + [f["seq"] for f in second if f["seq"] is not None]
    assert seqs == list(range(1, seqs[-1] + 1))  # no gap, no duplicate across the reconnect
    log = list(SessionEvent.objects.filter(session_id=session_id, seq__lte=seqs[-1]).order_by("seq"))
    assert [e.type for e in log] == [f["type"] for f in logged_first + second if f["seq"] is not None]
    assert any(f["type"] == "model.delta" for f in first + second)  # live text arrived, unlogged
    assert second[-1]["data"]["reason"] == "completed"


def test_interrupt_stops_a_slow_stream_on_the_worker(stack, api_owner_a, model_config_a, model_server):
    model_server.script(
        "agent", text_reply("slow " * 500, chunk_size=5, delay_per_chunk_s=0.05), text_reply("short answer")
    )
    key = api_owner_a.api_key
    with _api(stack, key) as api:
        session_id = api.post("/sessions/", json={"title": "interrupt me"}).json()["id"]
        with connect(f"ws://{stack}/ws/sessions/{session_id}/?token={key}") as ws:
            api.post(f"/sessions/{session_id}/inputs/", json={"text": "a long story please"})
            _frames_until(ws, lambda f: f["type"] == "model.delta")
            ws.send(json.dumps({"type": "interrupt"}))
            frames = _frames_until(ws, lambda f: f["type"] == "turn.ended")
            assert frames[-1]["data"]["reason"] == "aborted"
            status = _frames_until(ws, lambda f: f["type"] == "session.status")
            assert status[-1]["data"]["status"] == "interrupted"

            api.post(f"/sessions/{session_id}/inputs/", json={"text": "now briefly"})
            frames = _frames_until(ws, lambda f: f["type"] == "turn.ended")
            assert frames[-1]["data"]["reason"] == "completed"

    slow = model_server.requests_for("agent")[0]
    assert slow.wait_done(timeout=10)
    assert slow.disconnected and slow.chunks_sent < 500  # the stream was cut, not read to the end
    assert list(
        Turn.objects.filter(session_id=session_id).order_by("number").values_list("reason", flat=True)
    ) == ["aborted", "completed"]


def test_guidance_sent_mid_call_reaches_the_next_request_not_the_current_one(
    stack, api_owner_a, model_config_a, model_server
):
    model_server.script(
        "agent",
        tool_reply([tool_call("fs_list", {})], delay_before_s=1.5),
        text_reply("Understood, using metric units."),
    )
    key = api_owner_a.api_key
    with _api(stack, key) as api:
        session_id = api.post("/sessions/", json={"title": "guided"}).json()["id"]
        api.post(f"/sessions/{session_id}/inputs/", json={"text": "describe the workspace"})
        model_server.wait_for_requests(1, timeout=30)
        api.post(f"/sessions/{session_id}/inputs/", json={"text": "use metric units", "kind": "guidance"})
        events = []
        for _ in range(60):
            body = api.get(f"/sessions/{session_id}/events/", params={"after": len(events), "wait": 2}).json()
            events += body["events"]
            if any(e["type"] == "turn.ended" for e in events):
                break
    first, second = model_server.requests_for("agent")
    assert "use metric units" not in json.dumps(first.body["messages"])
    assert "use metric units" in second.body["messages"][-1]["content"]
    calls = list(ModelCall.objects.filter(session_id=session_id).order_by("id"))
    assert calls[1].last_message_id > calls[0].last_message_id
    assert [e["data"]["reason"] for e in events if e["type"] == "turn.ended"] == ["completed"]


def test_a_secret_in_an_mcp_header_and_shell_env_never_surfaces(
    stack, api_owner_a, tenant_a, model_config_a, model_server, tmp_path
):
    """The tools receive the secret; no row, event, evidence, frame, log line or later model request shows it."""
    import base64

    from sessions_app.models import Message, ModelCall
    from sessions_app.runtime import engine
    from tools_app.mcp.sync import add_server, refresh_server
    from tools_app.models import MCPServer, ToolSet
    from tools_app.secrets import set_secret

    secret = "sk-live-7c1f0e9d2b4a6e8f"
    set_secret(tenant_a, "API_TOKEN", secret)
    port = free_port()
    mcp_log = tmp_path / "mcp.log"
    example = [sys.executable, "-m", "tools_app.mcp.example_server", "--http", "--port", str(port)]
    with running(example, database_env_for_workers(), mcp_log) as mcp_proc:
        wait_for_port(port, mcp_proc, mcp_log)
        server = add_server(
            tenant_a,
            "example",
            MCPServer.Transport.STREAMABLE_HTTP,
            url=f"http://127.0.0.1:{port}/mcp",
            headers={"Authorization": "Bearer {{secret:API_TOKEN}}"},
        )
        refresh_server(server)

        model_server.script(
            "agent",
            tool_reply(
                [
                    tool_call("example__show_auth", {}, id="mcp"),
                    tool_call(
                        "shell_exec",
                        {
                            # TOKEN is bound by the admin's tool set (the model never references
                            # a secret): compare by digest.
                            "command": 'echo "$TOKEN"; printf %s "$TOKEN" | base64; '
                            f'test "$(printf %s "$TOKEN" | sha256sum | cut -c1-64)" = '
                            f'"{hashlib.sha256(secret.encode()).hexdigest()}" && echo MATCH',
                        },
                        id="sh",
                    ),
                ]
            ),
            # A model that somehow repeats the value, streamed in small pieces.
            text_reply(f"the token is {secret}, done", chunk_size=3, delay_per_chunk_s=0.01),
        )
        key = api_owner_a.api_key
        with _api(stack, key) as api:
            session_id = api.post("/sessions/", json={"title": "secrets"}).json()["id"]
            ToolSet.objects.create(
                tenant=tenant_a, name="tokens", shell_env={"TOKEN": "{{secret:API_TOKEN}}"}
            )
            engine.add_selected_capabilities(
                session_id,
                None,
                tools=["example__show_auth", "shell_exec"],
                toolsets=["tokens"],
                added_by="test",
            )
            with connect(f"ws://{stack}/ws/sessions/{session_id}/?token={key}") as ws:
                api.post(f"/sessions/{session_id}/inputs/", json={"text": "check the token"})
                # shell_exec is an external tool: the default policy asks a person first.
                frames = _frames_until(ws, lambda f: f["type"] == "approval.requested")
                decided = api.post(
                    f"/approvals/{frames[-1]['data']['approval_id']}/decide/", json={"decision": "approve"}
                )
                assert decided.status_code == 200
                frames += _frames_until(ws, lambda f: f["type"] == "turn.ended")
            raw_frames = json.dumps(frames)

    results = {m.tool_call_id: m.content for m in Message.objects.filter(session_id=session_id, role="tool")}
    assert "Bearer [REDACTED]" in results["mcp"]  # the header carried the value to the server
    assert "MATCH" in results["sh"] and "[REDACTED]" in results["sh"]  # env carried it to the sandbox
    encoded = base64.b64encode(secret.encode()).decode()
    stored = json.dumps(
        [
            list(Message.objects.filter(session_id=session_id).values_list("content", "tool_calls")),
            list(SessionEvent.objects.filter(session_id=session_id).values_list("data", flat=True)),
            list(ModelCall.objects.filter(session_id=session_id).values_list("attempt_errors", "error")),
        ],
        default=str,
    )
    requests = json.dumps([r.body for r in model_server.requests_for("agent")])
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("*.log"))
    for where, text in {
        "rows": stored,
        "frames": raw_frames,
        "model requests": requests,
        "logs": logs,
    }.items():
        assert secret not in text and encoded not in text, f"secret leaked into {where}"
    assert "the token is [REDACTED], done" in stored
