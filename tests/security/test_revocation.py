"""Revocation bites at once (issue #25): revoking an API key, or removing or deactivating a
member, closes that principal's open sockets with 4401 — on `/ws/sessions/{id}/` and
`/ws/sessions/` alike, while the client sends nothing — and ends its waiting long polls.

Everything runs through the real ASGI application and the configured channel layer; the
revocation goes through the same paths people use (owner operation, REST, Django admin).
"Promptly" is a generous timeout for the close, far below any wait the test asked for.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.core.asgi import get_asgi_application
from django.db import transaction
from django.test import Client
from django.utils import timezone

from config.asgi import application
from sessions_app.runtime import engine
from tenancy_app import ws
from tenancy_app.actions import do_revoke_api_key
from tenancy_app.models import ApiKey, Membership
from tenancy_app.throttling import long_poll_slots_held
from tests.runtime.helpers import send
from tests.support.ws import CONNECT_TIMEOUT_S

from ..factories import issue_key
from ..tenancy.test_websocket_auth import OUR_ORIGIN, cookie_header, session_cookie
from .test_long_poll import PROMPT_S, _db, _last_seq, _until

# How long a wait may take to end after access ended, on a loaded test machine: well below the
# wait itself (TestWaitingLongPollsEnd.WAIT), so a wait that only timed out still fails.
ENDED_S = 20

pytestmark = pytest.mark.django_db(transaction=True)

ROUTES = ["session", "list"]


@pytest.fixture
def session_a(tenant_a, owner_a):
    return engine.create_session(tenant=tenant_a, owner=owner_a, title="watched")


@pytest.fixture
def key_a(tenant_a, owner_a):
    return issue_key(tenant_a, owner_a, "listener")


@pytest.fixture
def member_key_a(tenant_a, member_a):
    return issue_key(tenant_a, member_a, "colleague")


def _path(route: str, session, query: str = "") -> str:
    if route == "session":
        return f"/ws/sessions/{session.pk}/?after=999999" + (f"&{query}" if query else "")
    return "/ws/sessions/" + (f"?{query}" if query else "")


async def open_socket(path: str, headers=()) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, path, headers=list(headers))
    connected, code = await communicator.connect(timeout=CONNECT_TIMEOUT_S)
    assert connected, f"refused with {code}"
    return communicator


async def closed_by_server(communicator) -> tuple[int, list[dict]]:
    """Waits (the client sending nothing) for the server to close: its close code and the frames
    it sent first."""
    frames = []
    while True:
        output = await communicator.receive_output(timeout=PROMPT_S)
        if output["type"] == "websocket.close":
            return output.get("code"), frames
        frames.append(json.loads(output["text"]))


async def assert_closed_4401(communicator):
    code, frames = await closed_by_server(communicator)
    assert code == ws.CLOSE_UNAUTHENTICATED == 4401
    assert [f["error"]["code"] for f in frames if f["type"] == "error"] == ["not_authenticated"]


async def assert_still_open(communicator, route: str):
    """The socket still answers a client frame (after re-checking its credentials)."""
    await communicator.send_json_to({"type": "ping"})
    frame = await communicator.receive_json_from(timeout=PROMPT_S)
    assert frame["type"] == "error" and frame["error"]["code"] == "unknown_frame", (route, frame)


def _revoke_through_rest(key: ApiKey, owner) -> None:
    client = Client()
    client.force_login(owner)
    assert client.delete(f"/api/v1/api-keys/{key.pk}/").status_code == 204


def _revoke_through_admin(key: ApiKey, owner) -> None:
    client = Client()
    client.force_login(owner)  # owner_a is the tenant admin persona
    response = client.post(
        "/admin/tenancy_app/apikey/", {"action": "revoke_keys", "_selected_action": [key.pk]}
    )
    assert response.status_code == 302


REVOCATIONS = {
    "owner_operation": lambda key, owner: do_revoke_api_key(key),
    "rest_delete": _revoke_through_rest,
    "admin_action": _revoke_through_admin,
}


class TestARevokedKeysSocketsClose:
    @pytest.mark.parametrize("how", REVOCATIONS)
    @pytest.mark.parametrize("route", ROUTES)
    async def test_an_idle_socket_is_closed_4401_at_once(self, session_a, key_a, owner_a, route, how):
        key, plaintext = key_a
        communicator = await open_socket(_path(route, session_a, f"token={plaintext}"))

        await database_sync_to_async(REVOCATIONS[how])(key, owner_a)

        await assert_closed_4401(communicator)
        await communicator.disconnect()

    @pytest.mark.parametrize("route", ROUTES)
    async def test_other_keys_and_browser_sockets_stay_open(
        self, session_a, key_a, member_key_a, owner_a, route
    ):
        revoked = await open_socket(_path(route, session_a, f"token={key_a[1]}"))
        colleague = await open_socket(_path(route, session_a, f"token={member_key_a[1]}"))
        cookie = await database_sync_to_async(session_cookie)(owner_a)
        same_user_browser = await open_socket(_path(route, session_a), [*OUR_ORIGIN, cookie_header(cookie)])

        await database_sync_to_async(do_revoke_api_key)(key_a[0])

        await assert_closed_4401(revoked)
        await assert_still_open(colleague, route)
        await assert_still_open(same_user_browser, route)  # the key was revoked, not the person
        for communicator in (revoked, colleague, same_user_browser):
            await communicator.disconnect()

    async def test_a_revocation_rolled_back_closes_nothing(self, session_a, key_a):
        communicator = await open_socket(_path("session", session_a, f"token={key_a[1]}"))

        def revoke_then_roll_back():
            with transaction.atomic():
                do_revoke_api_key(key_a[0])
                transaction.set_rollback(True)

        await database_sync_to_async(revoke_then_roll_back)()

        await assert_still_open(communicator, "session")
        await communicator.disconnect()

    @pytest.mark.parametrize("route", ROUTES)
    async def test_a_lost_notice_is_caught_by_the_periodic_recheck(
        self, session_a, key_a, route, monkeypatch
    ):
        monkeypatch.setattr(ws, "RECHECK_INTERVAL_S", 0.05)
        communicator = await open_socket(_path(route, session_a, f"token={key_a[1]}"))

        # Revoked behind the owner operation's back: no notice is sent.
        await database_sync_to_async(ApiKey.objects.filter(pk=key_a[0].pk).update)(revoked_at=timezone.now())

        await assert_closed_4401(communicator)
        await communicator.disconnect()


def _delete_membership(user, tenant) -> None:
    Membership.objects.filter(user=user, tenant=tenant).delete()


def _delete_membership_in_admin(user, tenant) -> None:
    admin = Client()
    admin.force_login(get_user_model().objects.create_superuser("root_op", "root@example.com", "pw"))
    membership = Membership.objects.get(user=user, tenant=tenant)
    response = admin.post(f"/admin/tenancy_app/membership/{membership.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not Membership.objects.filter(pk=membership.pk).exists()


def _deactivate(user, tenant) -> None:
    user.is_active = False
    user.save()


def _move_membership_to_someone_else(user, tenant) -> None:
    membership = Membership.objects.get(user=user, tenant=tenant)
    membership.user = get_user_model().objects.create_user("newcomer")
    membership.save()


def _delete_user(user, tenant) -> None:
    get_user_model().objects.filter(pk=user.pk).delete()


REMOVALS = {
    "membership_deleted": _delete_membership,
    "membership_deleted_in_admin": _delete_membership_in_admin,
    "user_deactivated": _deactivate,
    "membership_moved": _move_membership_to_someone_else,
    "user_deleted": _delete_user,
}


class TestARemovedMembersSocketsClose:
    @pytest.mark.parametrize("how", REMOVALS)
    @pytest.mark.parametrize("route", ROUTES)
    async def test_their_key_socket_is_closed_4401_at_once(
        self, session_a, member_key_a, member_a, tenant_a, route, how
    ):
        communicator = await open_socket(_path(route, session_a, f"token={member_key_a[1]}"))

        await database_sync_to_async(REMOVALS[how])(member_a, tenant_a)

        await assert_closed_4401(communicator)
        await communicator.disconnect()

    @pytest.mark.parametrize("how", ["membership_deleted", "membership_deleted_in_admin", "user_deactivated"])
    @pytest.mark.parametrize("route", ROUTES)
    async def test_their_browser_socket_is_closed_4401_at_once(
        self, session_a, member_a, tenant_a, route, how
    ):
        cookie = await database_sync_to_async(session_cookie)(member_a)
        communicator = await open_socket(_path(route, session_a), [*OUR_ORIGIN, cookie_header(cookie)])

        await database_sync_to_async(REMOVALS[how])(member_a, tenant_a)

        await assert_closed_4401(communicator)
        await communicator.disconnect()

    async def test_leaving_another_tenant_closes_nothing_here(
        self, session_a, member_key_a, member_a, tenant_b, outsider_b
    ):
        from tenancy_app.actions import do_set_membership

        await database_sync_to_async(do_set_membership)(tenant_b, member_a)
        communicator = await open_socket(_path("session", session_a, f"token={member_key_a[1]}"))

        await database_sync_to_async(_delete_membership)(member_a, tenant_b)

        await assert_still_open(communicator, "session")
        await communicator.disconnect()


@pytest.mark.parametrize("how", REMOVALS)
def test_the_notice_goes_out_only_once_the_database_says_so(member_a, tenant_a, how, monkeypatch):
    """Outside a transaction `on_commit` runs at once: a notice sent from before the write would
    let a listener re-read the old row, find access intact and wait on (seen as a long poll that
    outlived a membership move under load)."""
    from tenancy_app import revocation

    seen_at_notice: list[bool] = []
    monkeypatch.setattr(
        revocation,
        "_send",
        lambda groups: seen_at_notice.append(
            Membership.objects.filter(tenant=tenant_a, user_id=member_a.pk, user__is_active=True).exists()
        ),
    )

    REMOVALS[how](member_a, tenant_a)

    assert seen_at_notice and not any(seen_at_notice)


# --- long polls -------------------------------------------------------------------------------


class Poll:
    """One `GET …/events/?after=&wait=` through the ASGI app, with the given headers."""

    def __init__(self, app, session, after: int, wait: float, headers):
        path = f"/api/v1/sessions/{session.pk}/events/"
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": f"after={after}&wait={wait}".encode(),
            "root_path": "",
            "headers": [(b"host", b"testserver"), *headers],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        self.sent: list[dict] = []
        self._requested = False
        self._gone = asyncio.Event()
        self.task = asyncio.create_task(app(scope, self._receive, self._send))

    async def _receive(self):
        if not self._requested:
            self._requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message):
        self.sent.append(message)

    async def response(self) -> tuple[int, dict, dict]:
        await asyncio.wait_for(self.task, ENDED_S)
        start = self.sent[0]
        body = b"".join(m.get("body", b"") for m in self.sent[1:])
        return start["status"], dict(start["headers"]), json.loads(body)

    async def end(self):
        self._gone.set()
        await asyncio.wait_for(self.task, ENDED_S)


def bearer(plaintext: str):
    return [(b"authorization", f"Bearer {plaintext}".encode())]


class TestWaitingLongPollsEnd:
    WAIT = 30  # the test must never wait this long

    @pytest.fixture
    def asgi_app(self):
        return get_asgi_application()

    @pytest.mark.parametrize("how", ["owner_operation", "rest_delete", "admin_action"])
    async def test_a_revoked_keys_wait_ends_with_the_401_its_next_call_gets(
        self, asgi_app, session_a, key_a, owner_a, how
    ):
        key, plaintext = key_a
        last = await _db(_last_seq)(session_a)
        poll = Poll(asgi_app, session_a, last, self.WAIT, bearer(plaintext))
        await _until(lambda: long_poll_slots_held(f"key:{key.pk}") == 1)

        await _db(REVOCATIONS[how])(key, owner_a)
        status, headers, body = await poll.response()
        nxt = Poll(asgi_app, session_a, last, self.WAIT, bearer(plaintext))
        next_status, _, next_body = await nxt.response()

        assert status == 401 and body["error"]["code"] == "authentication_failed"
        assert headers[b"WWW-Authenticate"] == b'Bearer realm="api"'
        assert (next_status, next_body["error"]["code"]) == (status, body["error"]["code"])
        assert long_poll_slots_held(f"key:{key.pk}") == 0

    @pytest.mark.parametrize("how", ["membership_deleted", "user_deactivated", "membership_moved"])
    async def test_a_removed_members_key_wait_ends_too(
        self, asgi_app, session_a, member_key_a, member_a, tenant_a, how
    ):
        last = await _db(_last_seq)(session_a)
        poll = Poll(asgi_app, session_a, last, self.WAIT, bearer(member_key_a[1]))
        await _until(lambda: long_poll_slots_held(f"key:{member_key_a[0].pk}") == 1)

        await _db(REMOVALS[how])(member_a, tenant_a)
        status, _, body = await poll.response()

        assert status == 401 and body["error"]["code"] == "authentication_failed"
        assert body["error"]["message"] and body["error"].get("details", {}) == {}

    async def test_a_removed_members_browser_wait_ends_with_403(
        self, asgi_app, session_a, member_a, tenant_a
    ):
        cookie = await _db(session_cookie)(member_a)
        last = await _db(_last_seq)(session_a)
        poll = Poll(asgi_app, session_a, last, self.WAIT, [cookie_header(cookie)])
        await _until(lambda: long_poll_slots_held(f"user:{member_a.pk}") == 1)

        await _db(_delete_membership)(member_a, tenant_a)
        status, _, body = await poll.response()

        assert status == 403 and body["error"]["code"] == "permission_denied"
        assert long_poll_slots_held(f"user:{member_a.pk}") == 0

    async def test_a_colleagues_wait_goes_on_and_still_gets_the_next_event(
        self, asgi_app, session_a, key_a, member_key_a
    ):
        last = await _db(_last_seq)(session_a)
        revoked = Poll(asgi_app, session_a, last, self.WAIT, bearer(key_a[1]))
        colleague = Poll(asgi_app, session_a, last, self.WAIT, bearer(member_key_a[1]))
        await _until(lambda: long_poll_slots_held(f"key:{key_a[0].pk}") == 1)
        await _until(lambda: long_poll_slots_held(f"key:{member_key_a[0].pk}") == 1)

        await _db(do_revoke_api_key)(key_a[0])
        assert (await revoked.response())[0] == 401
        still_waiting = not colleague.task.done()
        await _db(send)(session_a, "for the colleague")
        status, _, body = await colleague.response()

        assert still_waiting
        assert status == 200 and [e["type"] for e in body["events"]] == ["input.queued"]
