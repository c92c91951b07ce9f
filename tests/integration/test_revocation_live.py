"""Revocation and the Origin check on the production path (issue #25): daphne (runstack, web only
with REDIS_URL), channels_redis, PostgreSQL, real WebSocket and HTTP clients.

The attack this answers: a `/ws/sessions/` listener that never sends a frame kept streaming
300 s after its key was revoked, and a page on another port of our host got cookie access.
"""

import sys
import threading
import time

import httpx2 as httpx
import pytest
from django.test import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tenancy_app.models import Membership
from tenancy_app.throttling import long_poll_slots_held

from ..factories import issue_key
from .processes import database_env_for_workers, free_port, running, wait_for_http

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

PROMPT_S = 15  # generous: the close must come long before anything the client would do


@pytest.fixture
def web(tmp_path):
    port = free_port()
    log = tmp_path / "web.log"
    with running(
        [sys.executable, "manage.py", "runstack", "--port", str(port)], database_env_for_workers(), log
    ) as proc:
        wait_for_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        yield f"127.0.0.1:{port}"


def _close_code(ws) -> tuple[int, list[str]]:
    """Reads (sending nothing) until the server closes: its close code and the frames before it."""
    frames = []
    try:
        while True:
            frames.append(ws.recv(timeout=PROMPT_S))
    except ConnectionClosed as closed:
        return closed.rcvd.code, frames


def _until(predicate, timeout=PROMPT_S):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _api(web, plaintext):
    return httpx.Client(
        base_url=f"http://{web}/api/v1", headers={"Authorization": f"Bearer {plaintext}"}, timeout=40
    )


def test_revoking_a_key_over_rest_closes_its_idle_sockets_and_ends_its_long_poll(
    web, api_owner_a, tenant_a, owner_a
):
    key, plaintext = issue_key(tenant_a, owner_a, "listener")
    with _api(web, api_owner_a.api_key) as admin, _api(web, plaintext) as listener:
        session_id = admin.post("/sessions/", json={"title": "watched"}).json()["id"]
        last = listener.get(f"/sessions/{session_id}/events/").json()["last_seq"]
        with (
            connect(f"ws://{web}/ws/sessions/{session_id}/?token={plaintext}&after={last}") as session_ws,
            connect(f"ws://{web}/ws/sessions/?token={plaintext}") as list_ws,
        ):
            polled = {}
            poll = threading.Thread(
                target=lambda: polled.update(
                    answer=listener.get(f"/sessions/{session_id}/events/", params={"after": last, "wait": 30})
                )
            )
            poll.start()
            _until(lambda: long_poll_slots_held(f"key:{key.pk}") == 1)  # the poll is waiting

            assert admin.delete(f"/api-keys/{key.pk}/").status_code == 204

            session_code, session_frames = _close_code(session_ws)
            list_code, _ = _close_code(list_ws)
            poll.join(PROMPT_S)

    assert session_code == 4401 and list_code == 4401
    assert '"not_authenticated"' in session_frames[-1]
    assert not poll.is_alive(), "the long poll kept waiting after its key was revoked"
    answer = polled["answer"]
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "authentication_failed"


def test_removing_a_member_closes_their_idle_socket(web, tenant_a, member_a):
    _, plaintext = issue_key(tenant_a, member_a, "member-listener")
    with connect(f"ws://{web}/ws/sessions/?token={plaintext}") as list_ws:
        Membership.objects.filter(tenant=tenant_a, user=member_a).delete()

        code, _ = _close_code(list_ws)

    assert code == 4401


class TestOriginOnDaphne:
    @pytest.fixture
    def cookie(self, owner_a):
        client = Client()
        client.force_login(owner_a)
        return f"sessionid={client.cookies['sessionid'].value}"

    def test_a_browser_origin_on_another_port_is_refused_with_403(self, web, cookie):
        port = int(web.rsplit(":", 1)[1])

        with pytest.raises(InvalidStatus) as refused:
            connect(
                f"ws://{web}/ws/whoami/",
                additional_headers={"Origin": f"http://127.0.0.1:{port + 1}", "Cookie": cookie},
            )

        assert refused.value.response.status_code == 403

    def test_our_own_origin_connects_with_the_cookie(self, web, cookie):
        with connect(
            f"ws://{web}/ws/whoami/", additional_headers={"Origin": f"http://{web}", "Cookie": cookie}
        ) as ws:
            assert '"owner_a"' in ws.recv(timeout=PROMPT_S)

    def test_a_token_client_without_an_origin_connects(self, web, api_owner_a):
        with connect(f"ws://{web}/ws/whoami/?token={api_owner_a.api_key}") as ws:
            assert '"hello"' in ws.recv(timeout=PROMPT_S)
