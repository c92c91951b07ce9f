"""Long poll `GET /api/v1/sessions/{id}/events/?after=&wait=`: bounded, authenticated,
tenant-scoped, woken by the event broadcast, and ended by a client disconnect.

The waits are driven through the real ASGI application (Django's ASGIHandler with the
project's middleware), the way daphne calls it, so cancellation on `http.disconnect` is
the real one.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.asgi import get_asgi_application
from django.db import connections
from django.utils.module_loading import import_string

from sessions_app.models import SessionEvent
from tenancy_app.models import ApiKey
from tenancy_app.throttling import acquire_long_poll_slot, long_poll_slots_held
from tests.runtime.helpers import new_session, send
from tests.tenancy.isolation import assert_error_shape

pytestmark = pytest.mark.django_db(transaction=True)

# Loose upper bound for "promptly": far below the waits the tests ask for.
PROMPT_S = 8


@pytest.fixture
def session_a(tenant_a, owner_a):
    return new_session(tenant_a, owner_a, title="Acme report")


def _last_seq(session) -> int:
    return SessionEvent.objects.filter(session=session).order_by("-seq").values_list("seq", flat=True)[0]


def _key_ident(client) -> str:
    prefix = client.api_key.split("_")[1]
    return f"key:{ApiKey.objects.get(prefix=prefix).pk}"


class AsgiCall:
    """One GET through the ASGI app; `disconnect()` makes the client go away mid-request."""

    def __init__(self, app, path: str, query: str, key: str | None):
        headers = [(b"host", b"testserver")]
        if key:
            headers.append((b"authorization", f"Bearer {key}".encode()))
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        self.sent: list[dict] = []
        self._gone = asyncio.Event()
        self._requested = False
        self.task = asyncio.create_task(app(self.scope, self._receive, self._send))

    async def _receive(self):
        if not self._requested:
            self._requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message):
        self.sent.append(message)

    def disconnect(self):
        self._gone.set()

    async def response(self, timeout: float = PROMPT_S) -> tuple[int, dict]:
        await asyncio.wait_for(self.task, timeout)
        status = self.sent[0]["status"]
        body = b"".join(m.get("body", b"") for m in self.sent[1:])
        return status, json.loads(body)


def _db(fn):
    """`fn` on a thread for an async test, giving its database connection back afterwards."""

    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return sync_to_async(run)


async def _until(predicate, timeout: float = PROMPT_S):
    async with asyncio.timeout(timeout):
        while not await sync_to_async(predicate)():
            await asyncio.sleep(0.02)


@pytest.fixture
def asgi_app():
    return get_asgi_application()


@pytest.mark.parametrize("wait", ["nan", "NaN", "inf", "-inf", "1e400", "-1", "31", "30.5", "abc", "0x10"])
def test_it_rejects_a_wait_that_is_not_a_finite_number_from_0_to_30(api_owner_a, session_a, wait):
    response = api_owner_a.get(f"/api/v1/sessions/{session_a.pk}/events/", {"wait": wait})

    error = assert_error_shape(response, 400, "validation_error")
    assert "wait" in error["details"]
    assert "wait" in error["message"]


@pytest.mark.parametrize("wait", ["0", "0.5", "30", ""])
def test_it_accepts_a_wait_from_0_to_30(api_owner_a, session_a, wait):
    response = api_owner_a.get(f"/api/v1/sessions/{session_a.pk}/events/", {"wait": wait, "after": 0})

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"events", "last_seq"} and body["events"]  # the log is not empty: no wait


def test_it_answers_at_once_with_the_events_after_seq(api_owner_a, session_a):
    send(session_a, "hello")
    last = _last_seq(session_a)

    body = api_owner_a.get(f"/api/v1/sessions/{session_a.pk}/events/?after={last - 1}&wait=30").json()

    assert [e["seq"] for e in body["events"]] == [last] and body["last_seq"] == last
    assert body["events"][0]["type"] == "input.queued"
    assert set(body["events"][0]) == {"seq", "type", "ts", "data"}


def test_last_seq_is_the_sessions_own_when_nothing_is_after_the_request(api_owner_a, session_a):
    """A client asking beyond the log learns where it really ends (not its own `after` echoed),
    and resuming from the answer loses nothing."""
    last = _last_seq(session_a)

    beyond = api_owner_a.get(f"/api/v1/sessions/{session_a.pk}/events/?after={last + 1000}").json()
    assert beyond == {"events": [], "last_seq": last}
    assert api_owner_a.get(f"/api/v1/sessions/{session_a.pk}/events/?after={last}").json() == {
        "events": [],
        "last_seq": last,
    }
    send(session_a, "hello")
    resumed = api_owner_a.get(f"/api/v1/sessions/{session_a.pk}/events/?after={beyond['last_seq']}").json()
    assert [e["seq"] for e in resumed["events"]] == [last + 1] and resumed["last_seq"] == last + 1


def test_an_anonymous_caller_gets_401(api_anonymous, session_a):
    response = api_anonymous.get(f"/api/v1/sessions/{session_a.pk}/events/?wait=5")

    assert_error_shape(response, 401, "not_authenticated")


def test_another_tenants_session_is_404_without_waiting(api_outsider_b, session_a):
    response = api_outsider_b.get(f"/api/v1/sessions/{session_a.pk}/events/?after=999&wait=30")

    assert_error_shape(response, 404, "not_found")


def test_an_unknown_or_malformed_session_id_is_404(api_owner_a):
    for sid in ("00000000-0000-0000-0000-000000000000", "not-a-uuid"):
        assert_error_shape(api_owner_a.get(f"/api/v1/sessions/{sid}/events/?wait=5"), 404, "not_found")


def test_a_browser_session_user_may_long_poll_too(client, member_a, session_a):
    client.force_login(member_a)

    response = client.get(f"/api/v1/sessions/{session_a.pk}/events/?after=0&wait=1")

    assert response.status_code == 200 and response.json()["events"]


def test_the_middleware_chain_is_async_so_a_wait_blocks_no_thread():
    """One sync-only middleware would make Django call the view through async_to_sync: the
    wait would then block a thread and a disconnect could not cancel it."""
    sync_only = [m for m in settings.MIDDLEWARE if not getattr(import_string(m), "async_capable", False)]

    assert sync_only == []


async def test_an_event_logged_during_the_wait_wakes_it(asgi_app, api_owner_a, session_a):
    last = await _db(_last_seq)(session_a)
    ident = await _db(_key_ident)(api_owner_a)
    call = AsgiCall(
        asgi_app, f"/api/v1/sessions/{session_a.pk}/events/", f"after={last}&wait=25", api_owner_a.api_key
    )
    await _until(lambda: long_poll_slots_held(ident) == 1)

    await _db(send)(session_a, "wake up")
    status, body = await call.response()

    assert status == 200
    assert [e["type"] for e in body["events"]] == ["input.queued"]
    assert body["last_seq"] == last + 1
    assert long_poll_slots_held(ident) == 0


async def test_a_wait_that_runs_out_answers_no_events_and_the_same_seq(asgi_app, api_owner_a, session_a):
    last = await _db(_last_seq)(session_a)
    call = AsgiCall(
        asgi_app, f"/api/v1/sessions/{session_a.pk}/events/", f"after={last}&wait=0.3", api_owner_a.api_key
    )

    assert await call.response() == (200, {"events": [], "last_seq": last})


async def test_a_disconnect_ends_the_wait_and_frees_the_slot(asgi_app, api_owner_a, session_a):
    last = await _db(_last_seq)(session_a)
    ident = await _db(_key_ident)(api_owner_a)
    call = AsgiCall(
        asgi_app, f"/api/v1/sessions/{session_a.pk}/events/", f"after={last}&wait=30", api_owner_a.api_key
    )
    await _until(lambda: long_poll_slots_held(ident) == 1)

    call.disconnect()
    await asyncio.wait_for(call.task, PROMPT_S)  # long before the 30 s wait would end

    assert call.sent == []  # nobody to answer
    assert long_poll_slots_held(ident) == 0


async def test_more_long_polls_than_the_limit_per_key_get_429(
    asgi_app, api_owner_a, api_member_a, session_a, settings
):
    settings.XAGENT_LONG_POLL_MAX_PER_KEY = 2
    last = await _db(_last_seq)(session_a)
    ident = await _db(_key_ident)(api_owner_a)
    path, query = f"/api/v1/sessions/{session_a.pk}/events/", f"after={last}&wait=30"
    waiting = [AsgiCall(asgi_app, path, query, api_owner_a.api_key) for _ in range(2)]
    await _until(lambda: long_poll_slots_held(ident) == 2)

    refused = AsgiCall(asgi_app, path, query, api_owner_a.api_key)
    status, body = await refused.response()
    other_key = AsgiCall(asgi_app, path, f"after={last}&wait=0.2", api_member_a.api_key)
    other_status, _ = await other_key.response()  # another key's budget is its own
    for call in waiting:
        call.disconnect()
    await asyncio.wait_for(asyncio.gather(*(c.task for c in waiting)), PROMPT_S)

    assert status == 429 and body["error"]["code"] == "throttled"
    assert set(body["error"]) == {"code", "message", "details"}
    assert dict(refused.sent[0]["headers"]).get(b"Retry-After")
    assert other_status == 200
    assert long_poll_slots_held(ident) == 0


def test_slots_held_by_other_processes_count_for_a_browser_user(client, member_a, session_a, settings):
    """The count lives in the shared cache: waits another web process holds use the budget."""
    settings.XAGENT_LONG_POLL_MAX_PER_KEY = 3
    client.force_login(member_a)
    held = [acquire_long_poll_slot(f"user:{member_a.pk}", 30) for _ in range(3)]
    last = _last_seq(session_a)

    response = client.get(f"/api/v1/sessions/{session_a.pk}/events/?after={last}&wait=5")

    assert all(held)
    assert_error_shape(response, 429, "throttled")


def test_the_openapi_schema_documents_the_long_poll(api_anonymous):
    schema = api_anonymous.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()

    operation = schema["paths"]["/api/v1/sessions/{id}/events/"]["get"]
    params = {p["name"]: p["schema"] for p in operation["parameters"] if p["in"] == "query"}
    assert params["wait"] == {"type": "number", "minimum": 0, "maximum": 30}
    assert params["after"]["type"] == "integer"
    page = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(schema["components"]["schemas"][page]["properties"]) == {"events", "last_seq"}
