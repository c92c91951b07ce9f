"""An idle WebSocket stays live with Redis as the channel layer (real daphne + Celery worker +
PostgreSQL + Redis).

channels_redis waits for a message with a blocking pop of 5 s (`bzpopmin`), and redis-py's
default read timeout is also 5 s: without headroom (`socket_timeout` on the channels_redis host
in config/settings.py) the read of an idle pop's empty answer times out, the consumer dies with
"Timeout reading from ...:6379" and the browser's socket is closed about 6 s after it went quiet.
"""

import json
import time

import httpx2 as httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.support.model_server import text_reply

from .processes import web_and_worker

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

IDLE_S = 30  # several blocking-pop rounds, and past daphne's first keepalive ping (20 s)


def _drain(ws, seconds, log_path):
    """Every frame the socket receives in `seconds`; fails if the server closes it meanwhile."""
    frames = []
    started = time.monotonic()
    deadline = started + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            frames.append(json.loads(ws.recv(timeout=left)))
        except TimeoutError:
            break
        except ConnectionClosed as closed:
            raise AssertionError(
                f"the idle socket was closed after {time.monotonic() - started:.1f} s ({closed!r}):\n"
                + log_path.read_text(errors="replace")[-4000:]
            ) from closed
    return frames


def _frames_until(ws, predicate, log_path, timeout=30):
    frames = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            frames.append(json.loads(ws.recv(timeout=deadline - time.monotonic())))
        except (TimeoutError, ConnectionClosed) as exc:
            raise AssertionError(
                f"{exc!r} after {frames[-5:]}\n{log_path.read_text(errors='replace')[-4000:]}"
            ) from exc
        if predicate(frames[-1]):
            return frames
    raise AssertionError(f"no matching frame: {frames[-5:]}")


def test_an_idle_session_socket_stays_open_and_then_streams_a_turn(
    tmp_path, api_owner_a, model_config_a, model_server
):
    model_server.script("agent", text_reply("Still here after the quiet spell."))
    key = api_owner_a.api_key
    web_log = tmp_path / "web.log"
    with (
        web_and_worker(tmp_path) as stack,
        httpx.Client(
            base_url=f"http://{stack}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as api,
    ):
        session_id = api.post("/sessions/", json={"title": "quiet"}).json()["id"]
        with (
            connect(f"ws://{stack}/ws/sessions/{session_id}/?token={key}") as ws,
            connect(f"ws://{stack}/ws/sessions/?token={key}") as list_ws,
        ):
            started = time.monotonic()
            idle_frames = _drain(ws, IDLE_S, web_log)
            idle_frames += _drain(list_ws, 0.1, web_log)
            idle_for = time.monotonic() - started
            assert idle_for >= IDLE_S
            assert not [f for f in idle_frames if f.get("type") == "error"], idle_frames

            posted = api.post(f"/sessions/{session_id}/inputs/", json={"text": "are you there?"})
            assert posted.status_code == 202, posted.text
            frames = _frames_until(ws, lambda f: f["type"] == "turn.ended", web_log)
            statuses = _frames_until(
                list_ws,
                lambda f: f["type"] == "session.status" and f["data"]["status"] == "idle",
                web_log,
            )

    types = [f["type"] for f in frames]
    assert "turn.started" in types and types.index("turn.started") < types.index("turn.ended")
    assert "message.committed" in types and "model.ended" in types
    assert frames[-1]["data"]["reason"] == "completed"
    logged = [f["seq"] for f in idle_frames + frames if f.get("seq") is not None]
    assert logged == list(range(logged[0], logged[-1] + 1))  # nothing missed after the quiet spell
    assert {f["data"]["status"] for f in statuses} >= {"running", "idle"}
    log = web_log.read_text(errors="replace")
    assert "Timeout reading" not in log and "Traceback" not in log, log[-4000:]
