"""Bad input over the WebSocket never takes the socket (or the server) down (issue #8, part 5).

CONTRACT: a malformed client frame gets `{"type": "error", "error": {code, message}}` and the
socket stays open; `input` frames obey the REST limits; a socket whose key is revoked or whose
user leaves the tenant is closed with 4401 on its next frame; a refused handshake closes before
accepting (daphne answers HTTP 403), never with a server error.
"""

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from config.asgi import application
from sessions_app.models import Input
from sessions_app.runtime import engine
from tenancy_app.actions import do_revoke_api_key
from tenancy_app.models import Membership
from tenancy_app.ws import CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED
from tests.support.ws import CONNECT_TIMEOUT_S

from ..factories import issue_key
from ..tenancy.test_websocket_auth import OUR_ORIGIN, cookie_header, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def session_a(tenant_a, owner_a):
    return engine.create_session(tenant=tenant_a, owner=owner_a, title="target")


@pytest.fixture
def key_a(tenant_a, owner_a):
    return issue_key(tenant_a, owner_a, "ws")


async def open_stream(session, plaintext: str, headers=()):
    communicator = WebsocketCommunicator(
        application, f"/ws/sessions/{session.pk}/?token={plaintext}&after=999999", headers=list(headers)
    )
    connected, code = await communicator.connect(timeout=CONNECT_TIMEOUT_S)
    assert connected, f"refused with {code}"
    return communicator


async def next_of_type(communicator, kind: str) -> dict:
    while True:
        frame = await communicator.receive_json_from(timeout=5)
        if frame["type"] == kind:
            return frame


async def assert_error_frame(communicator, code: str) -> dict:
    frame = await next_of_type(communicator, "error")
    assert set(frame["error"]) >= {"code", "message"}, frame
    assert frame["error"]["code"] == code, frame
    assert frame["error"]["message"].strip()
    return frame["error"]


async def assert_still_usable(communicator, session):
    await communicator.send_json_to({"type": "input", "text": "still here"})
    ack = await next_of_type(communicator, "ack")
    created = await database_sync_to_async(Input.objects.get)(pk=ack["data"]["input_id"])
    assert created.session_id == session.pk and created.payload["text"] == "still here"


def input_count(session) -> int:
    return Input.objects.filter(session=session).count()


class TestMalformedFrames:
    @pytest.mark.parametrize(
        "frame",
        [
            {"text_data": "not json"},
            {"text_data": '{"type": "input", "text": '},
            {"text_data": "[" * 100_000 + "]" * 100_000},
            {"text_data": '{"type": "input", "text": "x", "a": ' + "[" * 40 + "]" * 40 + "}"},
            {"bytes_data": b'{"type": "interrupt"}'},
            {"bytes_data": b"\xff\xfe\x00 not utf-8"},
        ],
        ids=["not-json", "truncated", "deep-100k", "deep-40", "binary", "invalid-utf8"],
    )
    async def test_a_malformed_frame_gets_an_error_and_the_socket_stays_usable(self, session_a, key_a, frame):
        communicator = await open_stream(session_a, key_a[1])
        await communicator.send_to(**frame)

        await assert_error_frame(communicator, "malformed_frame")
        await assert_still_usable(communicator, session_a)
        await communicator.disconnect()

    async def test_a_frame_over_the_body_limit_is_refused(self, session_a, key_a, settings):
        settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
        communicator = await open_stream(session_a, key_a[1])
        await communicator.send_json_to({"type": "input", "text": "x" * 2000})

        await assert_error_frame(communicator, "payload_too_large")
        await assert_still_usable(communicator, session_a)
        await communicator.disconnect()

    @pytest.mark.parametrize("content", [[1, 2], "input", 42, None, {"type": "teleport"}])
    async def test_a_frame_that_is_not_a_known_object_is_unknown_frame(self, session_a, key_a, content):
        communicator = await open_stream(session_a, key_a[1])
        await communicator.send_json_to(content)

        await assert_error_frame(communicator, "unknown_frame")
        await assert_still_usable(communicator, session_a)
        await communicator.disconnect()


class TestInputFramesFollowTheRestLimits:
    @pytest.mark.parametrize(
        "frame, field",
        [
            ({"text": "hello\x00world"}, "text"),
            ({"text": "x" * 100_001}, "text"),
            ({"text": "   "}, "text"),
            ({"text": ["a", "list"]}, "text"),
            ({"text": "hi", "kind": "interrupt"}, "kind"),
            ({"text": "hi", "attachments": ["../secret"]}, "attachments"),
            ({"text": "hi", "attachments": ["a\x00b"]}, "attachments"),
        ],
        ids=["nul", "too-long", "blank", "not-a-string", "bad-kind", "path-escape", "nul-attachment"],
    )
    async def test_a_bad_input_frame_is_a_validation_error_and_nothing_is_queued(
        self, session_a, key_a, frame, field
    ):
        before = await database_sync_to_async(input_count)(session_a)
        communicator = await open_stream(session_a, key_a[1])
        await communicator.send_json_to({"type": "input", **frame})

        error = await assert_error_frame(communicator, "validation_error")
        assert field in error["details"]
        assert await database_sync_to_async(input_count)(session_a) == before
        await assert_still_usable(communicator, session_a)
        await communicator.disconnect()

    async def test_attachments_travel_with_the_input(self, session_a, key_a):
        (engine.workspace_path(session_a) / "data").mkdir(parents=True, exist_ok=True)
        (engine.workspace_path(session_a) / "data" / "a.csv").write_text("a,b\n")
        communicator = await open_stream(session_a, key_a[1])
        await communicator.send_json_to({"type": "input", "text": "see file", "attachments": ["data/a.csv"]})

        ack = await next_of_type(communicator, "ack")
        created = await database_sync_to_async(Input.objects.get)(pk=ack["data"]["input_id"])
        assert created.payload["attachments"] == ["data/a.csv"]
        await communicator.disconnect()

    @pytest.mark.parametrize(
        "frame",
        [
            {"approval_id": 2**70, "decision": "approve"},
            {"approval_id": 1, "decision": "approve", "comment": "ok\x00"},
            {"approval_id": 1, "decision": "approve", "comment": "x" * 5001},
            {"approval_id": "1; drop", "decision": "approve"},
        ],
        ids=["huge-id", "nul-comment", "long-comment", "bad-id"],
    )
    async def test_a_bad_decide_frame_is_refused_without_a_crash(self, session_a, key_a, frame):
        communicator = await open_stream(session_a, key_a[1])
        await communicator.send_json_to({"type": "decide", **frame})

        await assert_error_frame(communicator, "invalid_decision")
        await assert_still_usable(communicator, session_a)
        await communicator.disconnect()


class TestCredentialsEndingWhileOpen:
    async def test_a_revoked_key_is_refused_on_the_next_frame_and_closed_4401(self, session_a, key_a):
        key, plaintext = key_a
        communicator = await open_stream(session_a, plaintext)
        await assert_still_usable(communicator, session_a)

        await database_sync_to_async(do_revoke_api_key)(key)
        before = await database_sync_to_async(input_count)(session_a)
        await communicator.send_json_to({"type": "input", "text": "after revocation"})

        await assert_error_frame(communicator, "not_authenticated")
        assert (await communicator.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4401}
        assert await database_sync_to_async(input_count)(session_a) == before

    async def test_a_key_user_removed_from_the_tenant_is_closed_4401(
        self, session_a, key_a, owner_a, tenant_a
    ):
        communicator = await open_stream(session_a, key_a[1])
        await database_sync_to_async(Membership.objects.filter(user=owner_a, tenant=tenant_a).delete)()

        await communicator.send_json_to({"type": "interrupt"})

        await assert_error_frame(communicator, "not_authenticated")
        assert (await communicator.receive_output(timeout=5))["code"] == CLOSE_UNAUTHENTICATED

    async def test_a_browser_user_removed_from_the_tenant_is_closed_4401(self, session_a, owner_a, tenant_a):
        cookie = await database_sync_to_async(session_cookie)(owner_a)
        communicator = WebsocketCommunicator(
            application, f"/ws/sessions/{session_a.pk}/", headers=[*OUR_ORIGIN, cookie_header(cookie)]
        )
        assert (await communicator.connect(timeout=CONNECT_TIMEOUT_S))[0]
        await database_sync_to_async(Membership.objects.filter(user=owner_a, tenant=tenant_a).delete)()

        await communicator.send_json_to({"type": "input", "text": "hi"})

        await assert_error_frame(communicator, "not_authenticated")
        assert (await communicator.receive_output(timeout=5))["code"] == CLOSE_UNAUTHENTICATED

    async def test_whoami_sockets_are_rechecked_too(self, key_a):
        key, plaintext = key_a
        communicator = WebsocketCommunicator(application, f"/ws/whoami/?token={plaintext}")
        assert (await communicator.connect(timeout=CONNECT_TIMEOUT_S))[0]
        await communicator.receive_json_from(timeout=5)  # hello
        await database_sync_to_async(do_revoke_api_key)(key)

        await communicator.send_json_to({"type": "ping"})

        await assert_error_frame(communicator, "not_authenticated")
        assert (await communicator.receive_output(timeout=5))["code"] == CLOSE_UNAUTHENTICATED


class TestRefusedHandshakes:
    """Closing before accept is how a handshake is refused: daphne turns it into HTTP 403."""

    @pytest.mark.parametrize(
        "path",
        [
            "/ws/nope/",
            "/ws/sessions/not-a-uuid/",
            "/ws/sessions/12345/",
            "/ws/sessions/%00/",
            "/",
        ],
    )
    async def test_an_unknown_path_or_malformed_session_id_is_refused(self, key_a, path):
        communicator = WebsocketCommunicator(application, f"{path}?token={key_a[1]}")

        connected, code = await communicator.connect(timeout=CONNECT_TIMEOUT_S)

        assert connected is False and code == CLOSE_NOT_FOUND
        await communicator.disconnect()  # end the consumer instance here, not at loop teardown

    async def test_a_nul_in_the_token_is_refused_as_unauthenticated(self, session_a):
        communicator = WebsocketCommunicator(
            application, f"/ws/sessions/{session_a.pk}/?token=xak_ab%00cd_ef"
        )

        connected, code = await communicator.connect(timeout=CONNECT_TIMEOUT_S)

        assert connected is False and code == CLOSE_UNAUTHENTICATED

    @pytest.mark.parametrize("after", ["99999999999999999999999", "-5", "x", "%00"])
    async def test_an_odd_after_still_connects(self, session_a, key_a, after):
        communicator = WebsocketCommunicator(
            application, f"/ws/sessions/{session_a.pk}/?token={key_a[1]}&after={after}"
        )

        connected, _ = await communicator.connect(timeout=CONNECT_TIMEOUT_S)

        assert connected is True
        await communicator.disconnect()
