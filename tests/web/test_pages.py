"""Browser pages with the Django test client: login, the workspace home, logout and the
tenant switch (CONTRACT Auth: browser sessions)."""

import json

import pytest
from django.conf import settings
from django.contrib.messages import get_messages
from django.test import Client

from tenancy_app.access import SESSION_TENANT_KEY
from tenancy_app.choices import Role

from ..factories import PASSWORD, TenantFactory, UserFactory, make_member

LOGIN = "/accounts/login/"


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def shown_tenant(client) -> str:
    response = client.get("/")
    assert response.status_code == 200
    return response.context["current_membership"].tenant.slug


@pytest.fixture
def owner_a_in_b(owner_a, tenant_b, outsider_b):
    return make_member(tenant_b, "owner_a", Role.MEMBER)


class TestLogin:
    def test_the_login_page_renders(self, db):
        response = Client().get(LOGIN)

        assert response.status_code == 200
        html = response.content.decode()
        assert 'name="username"' in html and 'name="password"' in html and "csrfmiddlewaretoken" in html

    def test_logging_in_lands_on_the_workspace_of_the_users_tenant(self, owner_a):
        client = Client()

        response = client.post(LOGIN, {"username": "owner_a", "password": PASSWORD})

        assert response.status_code == 302 and response["Location"] == "/"
        home = client.get("/")
        assert home.status_code == 200
        assert "<h1>Acme</h1>" in home.content.decode()
        assert "owner_a" in home.content.decode()

    def test_a_wrong_password_stays_on_the_login_page(self, owner_a):
        client = Client()

        response = client.post(LOGIN, {"username": "owner_a", "password": "wrong"})

        assert response.status_code == 200
        assert "didn't match" in response.content.decode()
        assert client.get("/").status_code == 302

    def test_login_honours_a_local_next_only(self, owner_a):
        local = Client().post(
            f"{LOGIN}?next=/admin/", {"username": "owner_a", "password": PASSWORD, "next": "/admin/"}
        )
        foreign = Client().post(
            LOGIN, {"username": "owner_a", "password": PASSWORD, "next": "https://evil.example/"}
        )

        assert local["Location"] == "/admin/"
        assert foreign["Location"] == "/"


class TestHome:
    def test_anonymous_visitors_are_sent_to_login(self, db):
        response = Client().get("/")

        assert response.status_code == 302
        assert response["Location"] == f"{LOGIN}?next=/"

    def test_a_user_without_a_tenant_is_told_so(self, db):
        response = logged_in(UserFactory(username="drifter")).get("/")

        assert response.status_code == 200
        assert "No tenant yet" in response.content.decode()

    def test_a_member_sees_the_tenant_but_no_admin_link(self, member_a):
        html = logged_in(member_a).get("/").content.decode()

        assert "<h1>Acme</h1>" in html
        assert 'href="/admin/"' not in html


class TestLogout:
    def test_logout_by_post_ends_the_session(self, owner_a):
        client = logged_in(owner_a)
        assert client.get("/").status_code == 200

        response = client.post("/accounts/logout/")

        assert response.status_code == 302 and response["Location"] == LOGIN
        assert client.get("/")["Location"].startswith(LOGIN)

    def test_logout_by_get_is_refused(self, owner_a):
        client = logged_in(owner_a)

        assert client.get("/accounts/logout/").status_code == 405
        assert client.get("/").status_code == 200


class TestTenantSwitch:
    def test_a_member_of_two_tenants_can_switch(self, owner_a_in_b):
        client = logged_in(owner_a_in_b)
        assert shown_tenant(client) == "acme"

        response = client.post("/tenants/switch/", {"tenant": "bravo"})

        assert response.status_code == 302 and response["Location"] == "/"
        assert shown_tenant(client) == "bravo"
        assert "<h1>Bravo</h1>" in client.get("/").content.decode()
        client.post("/tenants/switch/", {"tenant": "acme"})
        assert shown_tenant(client) == "acme"

    def test_the_picker_lists_only_the_users_tenants(self, owner_a_in_b):
        TenantFactory(slug="charlie", name="Charlie")

        html = logged_in(owner_a_in_b).get("/").content.decode()

        assert 'value="acme"' in html and 'value="bravo"' in html
        assert "charlie" not in html.lower()

    @pytest.mark.parametrize("slug", ["bravo", "nope", ""])
    def test_a_tenant_the_user_is_not_in_is_refused(self, owner_a, tenant_b, slug):
        client = logged_in(owner_a)

        response = client.post("/tenants/switch/", {"tenant": slug}, follow=True)

        assert response.status_code == 200
        assert [str(m) for m in response.context["messages"]] == ["You are not a member of that tenant."]
        assert SESSION_TENANT_KEY not in client.session
        assert shown_tenant(client) == "acme"
        assert "Bravo" not in client.get("/").content.decode()

    def test_a_refused_switch_keeps_the_previous_choice(self, owner_a_in_b):
        TenantFactory(slug="charlie", name="Charlie")
        client = logged_in(owner_a_in_b)
        client.post("/tenants/switch/", {"tenant": "bravo"})

        response = client.post("/tenants/switch/", {"tenant": "charlie"})

        assert any("not a member" in str(m) for m in get_messages(response.wsgi_request))
        assert shown_tenant(client) == "bravo"

    @pytest.mark.parametrize(
        "next_url, expected",
        [("/admin/", "/admin/"), ("https://evil.example/", "/"), ("//evil.example/", "/")],
    )
    def test_it_redirects_only_to_local_pages(self, owner_a_in_b, next_url, expected):
        response = logged_in(owner_a_in_b).post("/tenants/switch/", {"tenant": "bravo", "next": next_url})

        assert response["Location"] == expected

    def test_it_needs_a_post_with_a_csrf_token(self, owner_a_in_b):
        client = Client(enforce_csrf_checks=True)
        client.force_login(owner_a_in_b)

        assert client.get("/tenants/switch/").status_code == 405
        assert client.post("/tenants/switch/", {"tenant": "bravo"}).status_code == 403
        assert shown_tenant(client) == "acme"

    def test_anonymous_visitors_are_sent_to_login(self, tenant_a):
        response = Client().post("/tenants/switch/", {"tenant": "acme"})

        assert response.status_code == 302 and response["Location"].startswith(LOGIN)


class TestMemoriesPage:
    def test_anonymous_visitors_are_sent_to_login(self, db):
        response = Client().get("/memories/")

        assert response.status_code == 302
        assert response["Location"] == f"{LOGIN}?next=/memories/"

    def test_it_renders_the_list_frame_with_every_kind_to_filter_by(self, member_a):
        response = logged_in(member_a).get("/memories/")

        assert response.status_code == 200
        html = response.content.decode()
        assert 'id="memories-app"' in html and 'data-api="/api/v1/memories/"' in html
        assert "js/memories.js" in html
        for kind in ("entity", "topic", "preference", "constraint", "decision"):
            assert f'<option value="{kind}">' in html
        assert "memory_save" in html and "private to you" in html

    def test_the_top_nav_links_to_it_for_members_of_a_tenant(self, member_a):
        home = logged_in(member_a).get("/").content.decode()
        page = logged_in(member_a).get("/memories/").content.decode()

        assert 'href="/memories/" data-testid="nav-memories">Memories</a>' in home
        assert 'data-testid="nav-memories" aria-current="page">Memories</a>' in page

    def test_a_user_without_a_tenant_gets_no_link_and_is_told_why(self, db):
        client = logged_in(UserFactory(username="drifter"))

        assert "nav-memories" not in client.get("/").content.decode()
        html = client.get("/memories/").content.decode()
        assert "not a member of any tenant" in html and "memories.js" not in html


class TestSessionPage:
    """The Session page's frame: the goals panel, and the link from a sub-Session to its parent."""

    @pytest.fixture
    def main_a(self, tenant_a, owner_a):
        from sessions_app.runtime import engine

        return engine.create_session(tenant=tenant_a, owner=owner_a, title="Coordinator <b>")

    @pytest.fixture
    def sub_a(self, tenant_a, owner_a, main_a):
        from sessions_app.runtime import engine

        return engine.create_session(tenant=tenant_a, owner=owner_a, title="Child", kind="sub", parent=main_a)

    def test_a_sub_session_links_its_parent(self, owner_a, main_a, sub_a):
        response = logged_in(owner_a).get(f"/sessions/{sub_a.pk}/")

        assert response.status_code == 200
        html = response.content.decode()
        assert f'href="/sessions/{main_a.pk}/" data-testid="parent-link">Coordinator &lt;b&gt;</a>' in html
        assert response.context["boot"]["kind"] == "sub"
        assert "session_delegate" not in response.context["boot"]["defaultTools"]

    def test_a_main_session_has_no_parent_line_and_its_coordinator_tool_is_no_extra(self, owner_a, main_a):
        response = logged_in(owner_a).get(f"/sessions/{main_a.pk}/")

        assert 'data-testid="session-parent"' not in response.content.decode()
        assert "session_delegate" in response.context["boot"]["defaultTools"]

    def test_an_archived_parent_is_named_but_not_linked(self, owner_a, main_a, sub_a):
        from django.utils import timezone

        type(main_a).objects.filter(pk=main_a.pk).update(archived_at=timezone.now())

        html = logged_in(owner_a).get(f"/sessions/{sub_a.pk}/").content.decode()

        assert "of a Session that was archived" in html
        assert f"/sessions/{main_a.pk}/" not in html

    def test_the_goals_panel_shows_both_goals_each_with_its_editor(self, owner_a, main_a):
        type(main_a).objects.filter(pk=main_a.pk).update(session_goal="Ship the guide", phase_goal="")

        html = logged_in(owner_a).get(f"/sessions/{main_a.pk}/").content.decode()

        assert 'data-field="session_goal"' in html and 'data-field="phase_goal"' in html
        assert ">Ship the guide</p>" in html and ">not set yet</p>" in html
        assert 'aria-label="Edit the session goal"' in html and 'aria-label="Edit the phase goal"' in html
        assert '<label for="phase-goal-input" class="visually-hidden">Phase goal</label>' in html

    def test_the_goal_run_card_offers_the_form_with_the_apis_defaults(self, owner_a, main_a):
        response = logged_in(owner_a).get(f"/sessions/{main_a.pk}/")

        html = response.content.decode()
        assert 'data-testid="goal-run"' in html and "Run as a goal…" in html
        assert '<label for="goal-run-goal">Goal</label>' in html
        assert 'maxlength="10000" required' in html
        for field, value in (("max_rounds", "3"), ("token_budget", "200000"), ("wall_clock", "1:00")):
            assert f'id="goal-run-{field}" name="{field}" type="text"' in html
            assert f'value="{value}"' in html
        assert "at most 24:00" in html and "At most 50." in html
        assert html.index("js/goal_run.js") < html.index("js/session/main.js")

    def test_the_page_loads_its_modules_through_an_import_map(self, owner_a, main_a):
        """Native ES modules, no bundler: every module of js/session/ is in the page's import map
        (the served, in production hashed, name), ahead of the one module script."""
        client = Client()
        client.force_login(owner_a)
        html = client.get(f"/sessions/{main_a.pk}/").content.decode()

        modules = sorted(p.name for p in (settings.BASE_DIR / "static/js/session").glob("*.js"))
        import_map = json.loads(html.split('<script type="importmap">')[1].split("</script>")[0])
        assert sorted(url.rsplit("/", 1)[1] for url in import_map["imports"]) == modules
        assert {"main.js", "ctx.js", "timeline.js", "approvals.js", "connection.js"} <= set(modules)
        assert html.index('type="importmap"') < html.index(
            '<script type="module" src="/static/js/session/main.js">'
        )

    def test_the_page_boots_with_the_goal_run_the_api_would_answer(self, owner_a, main_a):
        from sessions_app.runtime import goal_driver

        client = logged_in(owner_a)
        assert client.get(f"/sessions/{main_a.pk}/").context["boot"]["goalRun"] is None  # the API: 404
        run = goal_driver.start(
            main_a.pk,
            goal="Write <notes>.md",
            max_rounds=2,
            token_budget=500,
            wall_clock_seconds=600,
            user=owner_a,
        )

        response = client.get(f"/sessions/{main_a.pk}/")

        shown = response.context["boot"]["goalRun"]
        assert shown == client.get(f"/api/v1/sessions/{main_a.pk}/goal-run/").json() | {
            "elapsed_seconds": shown["elapsed_seconds"]
        }
        assert (shown["id"], shown["status"], shown["max_rounds"]) == (run.pk, "active", 2)
        assert "Write <notes>.md" not in response.content.decode()  # json_script escapes it
