"""`/ws/sessions/{id}/`: catch-up from the log, then live, gap-free across reconnects."""

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from config.asgi import application
from sessions_app.models import Input
from sessions_app.runtime import engine
from tenancy_app.ws import CLOSE_NOT_FOUND
from tests.factories import issue_key
from tests.support.ws import CONNECT_TIMEOUT_S

from .helpers import new_session

pytestmark = pytest.mark.django_db(transaction=True)


def _connect(session_id, key, after=None):
    query = f"?token={key}" + (f"&after={after}" if after is not None else "")
    return WebsocketCommunicator(application, f"/ws/sessions/{session_id}/{query}")


@database_sync_to_async
def _setup(tenant, owner):
    session = new_session(tenant, owner)
    for i in range(3):
        engine.enqueue_input(session.pk, kind="message", payload={"text": f"m{i}"})
    return session, issue_key(tenant, owner)[1]


async def _receive_seqs(communicator, count):
    frames = [await communicator.receive_json_from(timeout=5) for _ in range(count)]
    return [f["seq"] for f in frames], frames


async def test_catch_up_then_live_then_reconnect_without_gaps(tenant_a, owner_a):
    session, key = await _setup(tenant_a, owner_a)
    first = _connect(session.pk, key)
    connected, _ = await first.connect(timeout=CONNECT_TIMEOUT_S)
    assert connected
    seqs, frames = await _receive_seqs(first, 4)  # session.status + 3 input.queued
    assert seqs == [1, 2, 3, 4] and frames[1]["type"] == "input.queued" and "ts" in frames[1]

    await database_sync_to_async(engine.enqueue_input)(session.pk, kind="message", payload={"text": "live"})
    seqs, frames = await _receive_seqs(first, 1)
    assert seqs == [5] and frames[0]["data"]["kind"] == "message"
    await first.disconnect()

    # Events committed while disconnected arrive on reconnect, after the last seen seq, once each.
    for text in ("offline 1", "offline 2"):
        await database_sync_to_async(engine.enqueue_input)(session.pk, kind="message", payload={"text": text})
    second = _connect(session.pk, key, after=5)
    assert (await second.connect(timeout=CONNECT_TIMEOUT_S))[0]
    seqs, _ = await _receive_seqs(second, 2)
    assert seqs == [6, 7]
    assert await second.receive_nothing(timeout=0.3)
    await second.disconnect()


async def test_client_frames_go_through_the_owner_operations(tenant_a, owner_a):
    session, key = await _setup(tenant_a, owner_a)
    communicator = _connect(session.pk, key, after=4)
    assert (await communicator.connect(timeout=CONNECT_TIMEOUT_S))[0]
    await communicator.send_json_to({"type": "input", "text": "from the socket", "kind": "guidance"})
    frames = [await communicator.receive_json_from(timeout=5) for _ in range(2)]
    by_type = {f["type"]: f for f in frames}
    assert by_type["ack"]["seq"] is None and by_type["input.queued"]["seq"] == 5
    created = await database_sync_to_async(Input.objects.get)(pk=by_type["ack"]["data"]["input_id"])
    assert created.kind == "guidance" and created.payload["text"] == "from the socket"

    await communicator.send_json_to({"type": "input", "text": ""})
    error = await communicator.receive_json_from(timeout=5)
    assert error["type"] == "error" and error["error"]["code"] == "validation_error"
    assert "text" in error["error"]["details"]
    await communicator.send_json_to({"type": "interrupt"})
    frames = [await communicator.receive_json_from(timeout=5) for _ in range(2)]
    assert {f["type"] for f in frames} == {"ack", "input.queued"}
    await communicator.disconnect()


async def test_another_tenant_cannot_open_the_stream(tenant_a, owner_a, outsider_b, tenant_b):
    session, _ = await _setup(tenant_a, owner_a)
    outsider_key = await database_sync_to_async(lambda: issue_key(tenant_b, outsider_b)[1])()
    communicator = _connect(session.pk, outsider_key)
    connected, code = await communicator.connect(timeout=CONNECT_TIMEOUT_S)
    assert not connected and code == CLOSE_NOT_FOUND
