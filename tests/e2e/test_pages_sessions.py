"""The Session page with the Django test client: who may open it (CONTRACT Auth: another
tenant's object is a 404, anonymous visitors log in first)."""

import pytest
from django.test import Client

from sessions_app.runtime import engine
from tenancy_app.choices import Role

from ..factories import make_member

LOGIN = "/accounts/login/"


@pytest.fixture(autouse=True)
def _isolated(settings, tmp_path):
    settings.XAGENT_WORKSPACES_DIR = tmp_path / "workspaces"


@pytest.fixture
def session_a(tenant_a, owner_a):
    return engine.create_session(tenant=tenant_a, owner=owner_a, title="Acme <b>report</b>")


@pytest.fixture
def session_b(tenant_b, outsider_b):
    return engine.create_session(tenant=tenant_b, owner=outsider_b, title="Bravo secret plans")


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page_of(session) -> str:
    return f"/sessions/{session.pk}/"


class TestSessionPage:
    def test_a_member_opens_a_session_of_the_tenant(self, session_a, member_a):
        response = logged_in(member_a).get(page_of(session_a))

        assert response.status_code == 200
        html = response.content.decode()
        assert 'data-testid="session-status"' in html and 'data-status="idle"' in html
        assert 'id="session-boot"' in html and f'"/ws/sessions/{session_a.pk}/"' in html
        # Titles are user text: escaped, never markup.
        assert "Acme &lt;b&gt;report&lt;/b&gt;" in html and "<b>report</b>" not in html

    def test_anonymous_visitors_are_sent_to_login(self, session_a):
        response = Client().get(page_of(session_a))

        assert response.status_code == 302
        assert response["Location"] == f"{LOGIN}?next={page_of(session_a)}"

    def test_another_tenants_session_is_a_404(self, session_b, owner_a):
        response = logged_in(owner_a).get(page_of(session_b))

        assert response.status_code == 404
        assert "Bravo secret plans" not in response.content.decode()

    def test_the_chosen_tenant_decides_not_any_membership(self, session_a, session_b, owner_a, tenant_b):
        client = logged_in(make_member(tenant_b, "owner_a", Role.MEMBER))

        assert client.get(page_of(session_b)).status_code == 404  # acting for Acme
        client.post("/tenants/switch/", {"tenant": "bravo"})
        assert client.get(page_of(session_b)).status_code == 200
        assert client.get(page_of(session_a)).status_code == 404

    def test_a_user_without_a_tenant_gets_a_404(self, session_a, db):
        from ..factories import UserFactory

        assert logged_in(UserFactory(username="drifter")).get(page_of(session_a)).status_code == 404

    def test_an_archived_session_is_a_404(self, session_a, owner_a):
        engine.archive_session(session_a.pk)

        assert logged_in(owner_a).get(page_of(session_a)).status_code == 404

    def test_an_unknown_id_is_a_404(self, owner_a):
        response = logged_in(owner_a).get("/sessions/00000000-0000-0000-0000-000000000000/")

        assert response.status_code == 404


class TestHomeWorkspace:
    def test_the_home_page_offers_the_session_list_and_form(self, owner_a):
        html = logged_in(owner_a).get("/").content.decode()

        assert "<h1>Acme</h1>" in html
        assert 'id="session-list"' in html and 'data-testid="new-session-submit"' in html
        assert "js/home.js" in html

    def test_without_a_tenant_there_is_no_list(self, db):
        from ..factories import UserFactory

        html = logged_in(UserFactory(username="drifter")).get("/").content.decode()

        assert "No tenant yet" in html and 'id="session-list"' not in html
