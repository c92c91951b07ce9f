"""WebSocket authentication (tenancy_app/ws.py) through the real ASGI application:
`?token=<api key>` or the session cookie from one of our own origins; anything else is 4401."""

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client

from config.asgi import application
from tenancy_app.access import SESSION_TENANT_KEY
from tenancy_app.actions import do_revoke_api_key
from tenancy_app.choices import Role
from tenancy_app.ws import CLOSE_UNAUTHENTICATED
from tests.support.ws import CONNECT_TIMEOUT_S

from ..factories import UserFactory, issue_key, make_member

pytestmark = pytest.mark.django_db(transaction=True)

WHOAMI = "/ws/whoami/"
OUR_ORIGIN = [(b"origin", b"http://localhost"), (b"host", b"localhost")]


def session_cookie(user, tenant_slug: str | None = None) -> str:
    client = Client()
    client.force_login(user)
    if tenant_slug:
        session = client.session
        session[SESSION_TENANT_KEY] = tenant_slug
        session.save()
    return client.cookies["sessionid"].value


def cookie_header(value: str) -> tuple[bytes, bytes]:
    return (b"cookie", f"sessionid={value}".encode())


async def open_socket(path: str = WHOAMI, headers=()):
    communicator = WebsocketCommunicator(application, path, headers=list(headers))
    connected, detail = await communicator.connect(timeout=CONNECT_TIMEOUT_S)
    return communicator, connected, detail


async def assert_refused(path: str = WHOAMI, headers=()):
    communicator, connected, code = await open_socket(path, headers)
    try:
        assert connected is False, "the connection was accepted"
        assert code == CLOSE_UNAUTHENTICATED == 4401
    finally:
        await communicator.disconnect()


async def hello(path: str = WHOAMI, headers=()) -> dict:
    communicator, connected, detail = await open_socket(path, headers)
    try:
        assert connected is True, f"refused with close code {detail}"
        return await communicator.receive_json_from(timeout=2)
    finally:
        await communicator.disconnect()


@pytest.fixture
def owner_a_key(owner_a, tenant_a):
    return issue_key(tenant_a, owner_a, "ws")[1]


@pytest.fixture
def owner_a_cookie(owner_a):
    return session_cookie(owner_a)


# Database setup happens in sync fixtures: the ORM refuses to run inside the test's event loop.
@pytest.fixture
def owner_a_in_b(owner_a, tenant_b, outsider_b):
    return make_member(tenant_b, "owner_a", Role.MEMBER)


@pytest.fixture
def revoked_key(owner_a, tenant_a):
    key, plaintext = issue_key(tenant_a, owner_a, "revoked")
    do_revoke_api_key(key)
    return plaintext


@pytest.fixture
def drifter_cookie(db):
    return session_cookie(UserFactory(username="drifter"))


class TestToken:
    async def test_a_valid_token_connects_and_names_the_tenant(self, owner_a_key):
        frame = await hello(f"{WHOAMI}?token={owner_a_key}")

        assert frame == {"type": "hello", "user": "owner_a", "tenant": "acme", "role": "owner"}

    @pytest.fixture
    def bravo_key(self, owner_a_in_b, tenant_b):
        return issue_key(tenant_b, owner_a_in_b, "bravo-ws")[1]

    async def test_the_token_decides_the_tenant_not_the_user(self, bravo_key, owner_a_key):
        assert (await hello(f"{WHOAMI}?token={owner_a_key}"))["tenant"] == "acme"

        frame = await hello(f"{WHOAMI}?token={bravo_key}")

        assert (frame["tenant"], frame["role"]) == ("bravo", "member")

    @pytest.mark.parametrize("token", ["nonsense", "xak_000000000000_nope", "Bearer%20x"])
    async def test_a_bad_token_is_refused(self, owner_a_key, token):
        await assert_refused(f"{WHOAMI}?token={token}")

    async def test_a_revoked_token_is_refused(self, revoked_key):
        await assert_refused(f"{WHOAMI}?token={revoked_key}")

    async def test_a_bad_token_is_refused_even_with_a_good_session(self, owner_a_cookie):
        await assert_refused(f"{WHOAMI}?token=nonsense", [*OUR_ORIGIN, cookie_header(owner_a_cookie)])


class TestSessionCookie:
    async def test_no_credentials_are_refused(self, tenant_a):
        await assert_refused(headers=OUR_ORIGIN)

    async def test_a_cookie_from_our_origin_connects(self, owner_a_cookie):
        frame = await hello(headers=[*OUR_ORIGIN, cookie_header(owner_a_cookie)])

        assert (frame["user"], frame["tenant"]) == ("owner_a", "acme")

    @pytest.fixture
    def bravo_cookie(self, owner_a_in_b):
        return session_cookie(owner_a_in_b, tenant_slug="bravo")

    async def test_a_cookie_follows_the_tenant_picked_in_the_browser(self, bravo_cookie):
        frame = await hello(headers=[*OUR_ORIGIN, cookie_header(bravo_cookie)])

        assert (frame["tenant"], frame["role"]) == ("bravo", "member")

    @pytest.mark.parametrize(
        "origin", [b"http://evil.example", b"http://localhost.evil.example", b"null", b"not a url"]
    )
    async def test_a_cookie_from_a_foreign_origin_is_refused(self, owner_a_cookie, origin):
        await assert_refused(
            headers=[(b"origin", origin), (b"host", b"localhost"), cookie_header(owner_a_cookie)]
        )

    async def test_a_cookie_without_an_origin_is_refused(self, owner_a_cookie):
        await assert_refused(headers=[(b"host", b"localhost"), cookie_header(owner_a_cookie)])

    async def test_a_forged_session_cookie_is_refused(self, tenant_a):
        await assert_refused(headers=[*OUR_ORIGIN, cookie_header("not-a-real-session")])

    async def test_a_user_without_a_tenant_is_refused(self, drifter_cookie):
        await assert_refused(headers=[*OUR_ORIGIN, cookie_header(drifter_cookie)])
