"""The WebSocket Origin check compares scheme, host and port (issue #25): a page on another port
of the same host is another origin and its socket gets no cookie access (handshake refused:
daphne answers 403, in-process clients see 4401). Clients without an Origin (not a browser)
authenticate with `?token=` as before."""

import pytest
from channels.testing import WebsocketCommunicator

from config.asgi import application
from sessions_app.runtime import engine
from tenancy_app.ws import CLOSE_UNAUTHENTICATED
from tests.support.ws import CONNECT_TIMEOUT_S

from ..factories import issue_key
from ..tenancy.test_websocket_auth import cookie_header, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

WHOAMI = "/ws/whoami/"


@pytest.fixture
def owner_a_cookie(owner_a):
    return session_cookie(owner_a)


async def handshake(path: str, headers) -> tuple[bool, object]:
    communicator = WebsocketCommunicator(application, path, headers=list(headers))
    try:
        return await communicator.connect(timeout=CONNECT_TIMEOUT_S)
    finally:
        await communicator.disconnect()


async def cookie_handshake(cookie: str, origin: bytes, host: bytes, *extra) -> tuple[bool, object]:
    return await handshake(WHOAMI, [(b"origin", origin), (b"host", host), cookie_header(cookie), *extra])


class TestThePortCounts:
    @pytest.mark.parametrize(
        "origin, host",
        [
            (b"http://localhost:8001", b"localhost:8000"),  # another app on the same host
            (b"http://localhost:8000", b"localhost"),  # Host without a port is port 80
            (b"http://localhost", b"localhost:8000"),
            (b"http://127.0.0.1:3000", b"127.0.0.1:8000"),
            (b"http://[::1]:8001", b"[::1]:8000"),
        ],
    )
    async def test_an_origin_on_another_port_is_refused(self, owner_a_cookie, origin, host):
        connected, code = await cookie_handshake(owner_a_cookie, origin, host)

        assert connected is False and code == CLOSE_UNAUTHENTICATED

    @pytest.mark.parametrize(
        "origin, host",
        [
            (b"http://localhost:8000", b"localhost:8000"),
            (b"http://LOCALHOST:8000", b"localhost:8000"),
            (b"http://localhost:80", b"localhost"),  # the default port, spelled out or not
            (b"http://localhost", b"localhost:80"),
            (b"http://[::1]:8000", b"[::1]:8000"),
        ],
    )
    async def test_the_same_scheme_host_and_port_connects(self, owner_a_cookie, origin, host):
        connected, _ = await cookie_handshake(owner_a_cookie, origin, host)

        assert connected is True


class TestTheSchemeCounts:
    async def test_an_https_origin_on_a_plain_socket_is_refused(self, owner_a_cookie):
        connected, code = await cookie_handshake(owner_a_cookie, b"https://localhost", b"localhost")

        assert connected is False and code == CLOSE_UNAUTHENTICATED

    async def test_behind_the_tls_proxy_the_forwarded_scheme_decides(self, owner_a_cookie, settings):
        settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
        proxied = (b"x-forwarded-proto", b"https")

        https_page = await cookie_handshake(owner_a_cookie, b"https://localhost", b"localhost", proxied)
        http_page = await cookie_handshake(owner_a_cookie, b"http://localhost", b"localhost", proxied)

        assert https_page[0] is True
        assert http_page == (False, CLOSE_UNAUTHENTICATED)


class TestTheHostCounts:
    async def test_a_host_outside_allowed_hosts_is_refused_even_when_the_origin_matches(self, owner_a_cookie):
        """DNS rebinding: the attacker's name resolves to us, Origin and Host agree, both foreign."""
        connected, code = await cookie_handshake(
            owner_a_cookie, b"http://rebound.example", b"rebound.example"
        )

        assert connected is False and code == CLOSE_UNAUTHENTICATED


class TestTrustedOrigins:
    @pytest.fixture(autouse=True)
    def trusted(self, settings):
        settings.CSRF_TRUSTED_ORIGINS = ["https://app.example.com:8443", "https://*.corp.example"]

    @pytest.mark.parametrize(
        "origin", [b"https://app.example.com:8443", b"https://eu.corp.example", b"https://corp.example"]
    )
    async def test_a_trusted_origin_connects(self, owner_a_cookie, origin):
        connected, _ = await cookie_handshake(owner_a_cookie, origin, b"localhost")

        assert connected is True

    @pytest.mark.parametrize(
        "origin",
        [
            b"https://app.example.com",  # port 443, not the trusted 8443
            b"https://app.example.com:8444",
            b"http://app.example.com:8443",
            b"https://eu.corp.example:8443",
            b"https://evilcorp.example",
        ],
    )
    async def test_a_trusted_host_on_another_port_or_scheme_is_refused(self, owner_a_cookie, origin):
        connected, code = await cookie_handshake(owner_a_cookie, origin, b"localhost")

        assert connected is False and code == CLOSE_UNAUTHENTICATED


class TestClients:
    @pytest.fixture
    def session_a(self, tenant_a, owner_a):
        return engine.create_session(tenant=tenant_a, owner=owner_a, title="api")

    @pytest.fixture
    def token(self, tenant_a, owner_a):
        return issue_key(tenant_a, owner_a, "script")[1]

    @pytest.mark.parametrize("route", ["whoami", "session", "list"])
    async def test_a_token_without_an_origin_connects_on_every_route(self, session_a, token, route):
        path = {"whoami": WHOAMI, "session": f"/ws/sessions/{session_a.pk}/", "list": "/ws/sessions/"}[route]

        connected, _ = await handshake(f"{path}?token={token}", [(b"host", b"localhost:8000")])

        assert connected is True

    async def test_a_cookie_without_an_origin_still_gets_nothing(self, owner_a_cookie):
        connected, code = await handshake(WHOAMI, [(b"host", b"localhost"), cookie_header(owner_a_cookie)])

        assert connected is False and code == CLOSE_UNAUTHENTICATED

    async def test_a_browser_on_our_own_port_is_who_connects(self, owner_a_cookie):
        communicator = WebsocketCommunicator(
            application,
            WHOAMI,
            headers=[
                (b"origin", b"http://localhost:8000"),
                (b"host", b"localhost:8000"),
                cookie_header(owner_a_cookie),
            ],
        )
        assert (await communicator.connect(timeout=CONNECT_TIMEOUT_S))[0]
        hello = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()

        assert (hello["user"], hello["tenant"]) == ("owner_a", "acme")
