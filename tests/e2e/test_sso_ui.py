"""Single sign-on in Chromium: the login page's "Sign in with …" button, the provider's own login
page (a real OpenID Connect provider on loopback, tests/support/oidc.py), and back in the
workspace as a new user of the tenant the groups claim maps to, against the real `runstack`."""

import re

import pytest

from tests.support.oidc import CLIENT_ID, CLIENT_SECRET, running_provider

from ..integration.processes import embedded_env, free_port, served_embedded
from .test_workspace import expect


@pytest.fixture(scope="module")
def sso(tmp_path_factory):
    root = tmp_path_factory.mktemp("sso-stack")
    port = free_port()
    env = {
        **embedded_env(root),
        "XAGENT_OIDC_ISSUER": f"http://127.0.0.1:{port}",
        "XAGENT_OIDC_CLIENT_ID": CLIENT_ID,
        "XAGENT_OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "XAGENT_OIDC_NAME": "Demo SSO",
        "XAGENT_OIDC_ROLE_RULES": "demo-team=demo:member",
    }
    with served_embedded(root, ("seed_demo",), env=env) as served:
        accounts = {"grace": {"groups": ["demo-team"], "email": "grace@example.test"}}
        with running_provider(f"{served.base}/accounts/oidc/callback/", accounts, port=port):
            yield served


@pytest.fixture
def stack(sso):
    return sso


def test_the_sign_in_button_takes_a_new_user_to_their_tenant(page, tmp_path):
    page.goto("/accounts/login/")
    page.get_by_test_id("sso-sign-in").click()
    # The provider's own login page (its development interactions: any password).
    page.locator("input[name=login]").fill("grace")
    page.locator("input[name=password]").fill("grace's password at the provider")
    page.locator("button[type=submit]").first.click()
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.get_by_test_id("current-tenant")).to_have_text("Demo workspace")
    expect(page.locator(".user")).to_have_text("grace")
    page.screenshot(path=str(tmp_path / "signed-in-with-sso.png"), full_page=True)
