"""`/ws/sessions/`: the tenant's `session.status` changes for the list page (CONTRACT WebSocket).

owner_a follows tenant A; outsider_b, connected at the same time, never hears of A's Sessions."""

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from config.asgi import application
from sessions_app.runtime import engine
from tenancy_app.actions import do_revoke_api_key
from tests.support.ws import CONNECT_TIMEOUT_S

from ..factories import issue_key

pytestmark = pytest.mark.django_db(transaction=True)


async def follow(tenant, user) -> WebsocketCommunicator:
    _, plaintext = await database_sync_to_async(issue_key)(tenant, user, "list")
    communicator = WebsocketCommunicator(application, f"/ws/sessions/?token={plaintext}")
    connected, code = await communicator.connect(timeout=CONNECT_TIMEOUT_S)
    assert connected, f"refused with {code}"
    return communicator


async def test_it_streams_status_changes_of_the_tenants_sessions(tenant_a, owner_a):
    communicator = await follow(tenant_a, owner_a)

    session = await database_sync_to_async(engine.create_session)(tenant=tenant_a, owner=owner_a, title="x")
    frame = await communicator.receive_json_from(timeout=5)

    assert frame["type"] == "session.status"
    assert frame["session"] == str(session.pk)
    assert frame["data"]["status"] == "idle"
    assert isinstance(frame["seq"], int) and frame["ts"]
    await communicator.disconnect()


async def test_another_tenant_hears_nothing(tenant_a, owner_a, tenant_b, outsider_b):
    outsider = await follow(tenant_b, outsider_b)
    owner = await follow(tenant_a, owner_a)

    await database_sync_to_async(engine.create_session)(tenant=tenant_a, owner=owner_a, title="secret")
    await owner.receive_json_from(timeout=5)  # delivered to A, so the broadcast has happened

    assert await outsider.receive_nothing(timeout=0.3)
    await outsider.disconnect()
    await owner.disconnect()


async def test_it_refuses_an_anonymous_handshake(db):
    communicator = WebsocketCommunicator(application, "/ws/sessions/")
    connected, code = await communicator.connect(timeout=CONNECT_TIMEOUT_S)
    assert not connected and code == 4401


async def test_a_client_frame_is_answered_unknown_frame_and_the_socket_stays(tenant_a, owner_a):
    communicator = await follow(tenant_a, owner_a)

    await communicator.send_json_to({"type": "input", "text": "hello"})
    frame = await communicator.receive_json_from(timeout=5)
    assert frame["type"] == "error" and frame["error"]["code"] == "unknown_frame"

    await database_sync_to_async(engine.create_session)(tenant=tenant_a, owner=owner_a, title="still on")
    assert (await communicator.receive_json_from(timeout=5))["type"] == "session.status"
    await communicator.disconnect()


async def test_a_revoked_key_is_closed_4401_on_its_next_frame(tenant_a, owner_a):
    key, plaintext = await database_sync_to_async(issue_key)(tenant_a, owner_a, "list")
    communicator = WebsocketCommunicator(application, f"/ws/sessions/?token={plaintext}")
    assert (await communicator.connect(timeout=CONNECT_TIMEOUT_S))[0]

    await database_sync_to_async(do_revoke_api_key)(key)
    await communicator.send_json_to({"type": "ping"})

    frame = await communicator.receive_json_from(timeout=5)
    assert frame["error"]["code"] == "not_authenticated"
    assert (await communicator.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4401}
