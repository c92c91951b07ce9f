"""Single sign-on (issue #28) against a real OpenID Connect provider on loopback
(tests/support/oidc.py: panva's oidc-provider in Node.js). Django's test client is the browser at
the workspace, requests the browser at the provider; the workspace itself talks to the provider for
real (discovery, keys, the code exchange).

- the first sign-in creates the user, with the roles the groups claim gives by the operator's rules;
- a group the provider no longer lists takes its membership away at the next sign-in;
- a changed state, a nonce of another sign-in, an ID token altered on the way: refused;
- no group that maps to a tenant, the provider down: a clear page, nobody signed in;
- a tenant that turned password sign-in off: its members use the provider only.
"""

from __future__ import annotations

import base64
import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.test import Client

from tenancy_app.models import AuditEntry, Membership, OIDCIdentity, Tenant
from tests.factories import TenantFactory, UserFactory
from tests.support.oidc import CLIENT_ID, CLIENT_SECRET, running_provider, sign_in_at

pytestmark = pytest.mark.django_db(transaction=True)

CALLBACK = "http://testserver/accounts/oidc/callback/"
RULES = "acme-admins=acme:admin, acme-staff=acme:member, bravo-staff=bravo:member"


@pytest.fixture
def tenants(tenant_a):
    return tenant_a, TenantFactory(slug="bravo", name="Bravo")


@contextmanager
def provider(settings, accounts, *, port=None):
    with running_provider(CALLBACK, accounts, port=port) as issuer:
        settings.XAGENT_OIDC_ISSUER = issuer
        settings.XAGENT_OIDC_CLIENT_ID = CLIENT_ID
        settings.XAGENT_OIDC_CLIENT_SECRET = CLIENT_SECRET
        settings.XAGENT_OIDC_NAME = "Acme SSO"
        settings.XAGENT_OIDC_ROLE_RULES = RULES
        yield issuer


def start(browser: Client) -> str:
    response = browser.get("/accounts/oidc/login/")
    assert response.status_code == 302, response.content[:500]
    return response["Location"]


def sign_in(browser: Client, login: str):
    back = sign_in_at(start(browser), login, CALLBACK)
    return browser.get(back.removeprefix("http://testserver"))


def me(browser: Client) -> dict:
    response = browser.get("/api/v1/me/")
    return response.json() if response.status_code == 200 else {}


def test_the_first_sign_in_creates_the_user_with_the_roles_their_groups_give(settings, tenants):
    with provider(settings, {"ada": {"groups": ["acme-admins", "bravo-staff", "unmapped"]}}):
        browser = Client()
        assert b"Sign in with Acme SSO" in browser.get("/accounts/login/").content
        response = sign_in(browser, "ada")
        assert response.status_code == 302 and response["Location"] == "/"
        profile = me(browser)
        assert (profile["username"], profile["role"]) == ("ada", "admin")
    acme, bravo = tenants
    assert dict(Membership.objects.filter(user__username="ada").values_list("tenant__slug", "role")) == {
        "acme": "admin",
        "bravo": "member",
    }
    identity = OIDCIdentity.objects.get()
    assert identity.subject == "ada" and not identity.user.has_usable_password()
    assert AuditEntry.objects.filter(tenant=acme, action="auth.signed_in", actor_username="ada").count() == 1
    assert AuditEntry.objects.filter(tenant=acme, action="auth.user_provisioned").count() == 1


def test_a_group_removed_at_the_provider_removes_its_membership_at_the_next_sign_in(settings, tenants):
    with provider(settings, {"ada": {"groups": ["acme-admins", "bravo-staff"]}}) as issuer:
        sign_in(Client(), "ada")
    port = int(issuer.rsplit(":", 1)[1])  # the same provider (issuer), restarted with other groups
    with provider(settings, {"ada": {"groups": ["acme-staff"]}}, port=port):
        assert sign_in(Client(), "ada").status_code == 302
    assert dict(Membership.objects.filter(user__username="ada").values_list("tenant__slug", "role")) == {
        "acme": "member"
    }
    assert OIDCIdentity.objects.count() == 1  # the same account, recognised by its subject


def test_an_existing_local_account_of_the_same_name_is_never_signed_in_to(settings, tenants, tenant_a):
    local = UserFactory(username="ada")
    Membership.objects.create(tenant=tenant_a, user=local, role="owner")
    with provider(settings, {"ada": {"groups": ["acme-staff"]}}):
        browser = Client()
        sign_in(browser, "ada")
        assert me(browser)["username"] == "ada-2"


def test_a_changed_state_is_refused(settings, tenants):
    with provider(settings, {"ada": {"groups": ["acme-staff"]}}):
        browser = Client()
        back = urlsplit(sign_in_at(start(browser), "ada", CALLBACK))
        query = parse_qs(back.query)
        query["state"] = ["forged-" + query["state"][0]]
        response = browser.get(back.path, {k: v[0] for k, v in query.items()})
        assert response.status_code == 400 and b"could not be verified" in response.content
        assert me(browser) == {}


def test_a_code_issued_for_another_sign_in_fails_the_nonce(settings, tenants):
    with provider(settings, {"ada": {"groups": ["acme-staff"]}}):
        browser = Client()
        first = urlsplit(sign_in_at(start(browser), "ada", CALLBACK))
        # A second sign-in starts in the same browser; the first one's code comes back with the
        # second one's state (its nonce is the second one's, the ID token carries the first's).
        second = parse_qs(urlsplit(start(browser)).query)
        code = parse_qs(first.query)["code"][0]
        response = browser.get(first.path, {"code": code, "state": second["state"][0]})
        assert response.status_code == 400
        assert me(browser) == {}


@contextmanager
def tampering_proxy(upstream: str):
    """Forwards to the provider, but alters the ID token of every token response (its payload,
    not its signature): what an attacker on the way would do."""

    class Handler(BaseHTTPRequestHandler):
        def _forward(self, method):
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            response = requests.request(
                method, upstream + self.path, headers=headers, data=body, allow_redirects=False, timeout=10
            )
            content = response.content
            if self.path.startswith("/.well-known/openid-configuration"):
                # The code exchange comes this way too (the keys and the issuer stay the real ones).
                metadata = response.json()
                metadata["token_endpoint"] = f"{proxy_url()}/token"
                content = json.dumps(metadata).encode()
            if self.path.startswith("/token") and response.status_code == 200:
                token = response.json()
                head, payload, signature = token["id_token"].split(".")
                claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
                claims["groups"] = ["acme-admins"]
                forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
                token["id_token"] = f"{head}.{forged}.{signature}"
                content = json.dumps(token).encode()
            self.send_response(response.status_code)
            for key, value in response.headers.items():
                if key.lower() not in (
                    "content-length",
                    "transfer-encoding",
                    "content-encoding",
                    "connection",
                ):
                    self.send_header(key, value)
            self.send_header("content-length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def do_GET(self):
            self._forward("GET")

        def do_POST(self):
            self._forward("POST")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def proxy_url() -> str:
        return f"http://127.0.0.1:{server.server_address[1]}"

    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy_url()
    finally:
        server.shutdown()


def test_an_id_token_altered_on_the_way_is_refused(settings, tenants):
    with running_provider(CALLBACK, {"ada": {"groups": ["acme-staff"]}}) as issuer:
        with tampering_proxy(issuer) as proxy:
            # The workspace reads the provider's metadata and exchanges the code through the
            # proxy; the metadata names the real issuer, whose keys check the token's signature.
            metadata = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=10).json()
            assert metadata["issuer"] == issuer
            settings.XAGENT_OIDC_ISSUER = proxy
            settings.XAGENT_OIDC_CLIENT_ID, settings.XAGENT_OIDC_CLIENT_SECRET = CLIENT_ID, CLIENT_SECRET
            settings.XAGENT_OIDC_ROLE_RULES = RULES
            browser = Client()
            response = sign_in(browser, "ada")
    assert response.status_code == 400 and b"could not be verified" in response.content
    assert me(browser) == {} and not Membership.objects.filter(user__username="ada").exists()


def test_without_a_group_that_maps_to_a_tenant_nobody_is_signed_in(settings, tenants):
    with provider(settings, {"zed": {"groups": ["marketing"]}}):
        browser = Client()
        response = sign_in(browser, "zed")
        assert (
            response.status_code == 403 and b"none of your groups gives you a workspace" in response.content
        )
        assert me(browser) == {}
    assert not OIDCIdentity.objects.exists()


def test_the_provider_down_is_a_clear_page(settings, tenants):
    with provider(settings, {}) as issuer:
        pass  # stopped: nothing listens at the issuer any more
    settings.XAGENT_OIDC_ISSUER = issuer
    response = Client().get("/accounts/oidc/login/")
    assert response.status_code == 503 and b"cannot be reached" in response.content


def test_a_tenant_can_turn_password_sign_in_off(tenant_a, tenants):
    acme, bravo = tenants
    person = UserFactory(username="pat")
    person.set_password("pat-password-123")
    person.save()
    Membership.objects.create(tenant=acme, user=person, role="member")
    Tenant.objects.filter(pk=acme.pk).update(password_sign_in=False)
    credentials = {"username": "pat", "password": "pat-password-123"}
    response = Client().post("/accounts/login/", credentials)
    assert response.status_code == 200 and b"didn't match" in response.content  # refused
    Membership.objects.create(tenant=bravo, user=person, role="member")  # bravo still allows them
    assert Client().post("/accounts/login/", credentials).status_code == 302


def test_without_an_issuer_there_is_no_button_and_no_route(settings):
    settings.XAGENT_OIDC_ISSUER = ""
    assert b"Sign in with" not in Client().get("/accounts/login/").content
    assert Client().get("/accounts/oidc/login/").status_code == 404


def test_turning_password_sign_in_off_is_a_tenant_setting_its_admins_change_and_the_log_shows(
    owner_a, tenant_a
):
    admin = Client()
    admin.force_login(owner_a)
    response = admin.post(
        f"/admin/tenancy_app/tenant/{tenant_a.pk}/change/",
        {"name": tenant_a.name, "auto_resume_after_recovery": "on"},  # the box left unticked: off
    )
    assert response.status_code == 302, response.content[:1500]
    assert Tenant.objects.get(pk=tenant_a.pk).password_sign_in is False
    entry = AuditEntry.objects.get(tenant=tenant_a, action="tenant.changed")
    assert (
        entry.changes["password_sign_in"] == {"before": True, "after": False}
        and entry.actor_username == "owner_a"
    )
