"""Django admin scoping: a tenant admin (staff owner of A, not a superuser) sees, picks and
changes only tenant A's rows; a superuser sees every tenant; members stay out of admin."""

import hashlib
import re

import pytest
from django.contrib.messages import get_messages
from django.test import Client

from tenancy_app.models import ApiKey, Membership, Tenant

from ..factories import UserFactory, issue_key

ADMIN = "/admin/tenancy_app"
KEY_IN_MESSAGE = re.compile(r"\bxak_[0-9a-f]{12}_[A-Za-z0-9_-]{20,}")


def admin_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def rows(owner_a, member_a, outsider_b, tenant_a, tenant_b):
    """One API key in each tenant, besides the memberships the personas bring."""
    key_a, _ = issue_key(tenant_a, member_a, "acme-key")
    key_b, _ = issue_key(tenant_b, outsider_b, "bravo-key")
    return {"key_a": key_a, "key_b": key_b}


@pytest.fixture
def tenant_admin(owner_a):
    assert owner_a.is_staff and not owner_a.is_superuser, "owner_a is the tenant admin persona"
    return admin_client(owner_a)


@pytest.fixture
def superuser_client(db):
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    return admin_client(root)


def changelist(client, model: str):
    response = client.get(f"{ADMIN}/{model}/")
    assert response.status_code == 200, response.status_code
    return response, list(response.context["cl"].result_list)


class TestTenantAdminChangelists:
    def test_it_lists_only_tenant_a(self, tenant_admin, rows, tenant_a):
        _, tenants = changelist(tenant_admin, "tenant")
        _, memberships = changelist(tenant_admin, "membership")
        _, keys = changelist(tenant_admin, "apikey")

        assert tenants == [tenant_a]
        assert {m.user.username for m in memberships} == {"owner_a", "member_a"}
        assert {m.tenant_id for m in memberships} == {tenant_a.pk}
        assert keys == [rows["key_a"]]

    @pytest.mark.parametrize("model", ["tenant", "membership", "apikey"])
    def test_the_rows_on_the_page_never_name_tenant_b(self, tenant_admin, rows, model):
        response, _ = changelist(tenant_admin, model)
        table = response.content.decode().split('id="result_list"', 1)[1].split("</table>", 1)[0]

        assert "acme" in table
        assert "bravo" not in table and "outsider_b" not in table

    @pytest.mark.parametrize("model", ["tenant", "membership", "apikey"])
    def test_the_whole_page_never_names_tenant_b(self, tenant_admin, rows, model):
        response, _ = changelist(tenant_admin, model)

        html = response.content.decode().lower()
        assert "bravo" not in html and "outsider_b" not in html

    def test_the_admin_index_and_forms_never_name_tenant_b(self, tenant_admin, rows, tenant_a):
        for url in (
            "/admin/",
            f"{ADMIN}/apikey/add/",
            f"{ADMIN}/membership/add/",
            f"{ADMIN}/tenant/{tenant_a.pk}/change/",
        ):
            response = tenant_admin.get(url)
            assert response.status_code == 200, url
            html = response.content.decode().lower()
            assert "bravo" not in html and "outsider_b" not in html, url

    def test_a_crafted_filter_for_tenant_b_shows_none_of_its_rows(self, tenant_admin, rows, tenant_b):
        response = tenant_admin.get(f"{ADMIN}/apikey/", {"tenant__id__exact": tenant_b.pk})

        assert response.status_code == 200
        assert rows["key_b"] not in response.context["cl"].result_list
        assert "bravo-key" not in response.content.decode()


class TestTenantAdminObjectPages:
    @pytest.mark.parametrize("model", ["tenant", "membership", "apikey"])
    def test_tenant_b_change_pages_are_not_found(self, tenant_admin, rows, tenant_b, outsider_b, model):
        obj = {
            "tenant": tenant_b,
            "membership": Membership.objects.get(tenant=tenant_b, user=outsider_b),
            "apikey": rows["key_b"],
        }[model]

        response = tenant_admin.get(f"{ADMIN}/{model}/{obj.pk}/change/")

        assert response.status_code in (302, 404)
        if response.status_code == 302:
            assert response["Location"] == "/admin/", "redirected as 'does not exist', not to a login"
            followed = tenant_admin.get(response["Location"])
            assert "bravo" not in followed.content.decode().lower()
            assert any("doesn" in str(m) and "exist" in str(m) for m in get_messages(followed.wsgi_request))

    def test_it_cannot_change_tenant_b_by_posting(self, tenant_admin, tenant_b, rows):
        response = tenant_admin.post(f"{ADMIN}/tenant/{tenant_b.pk}/change/", {"name": "Pwned"})

        assert response.status_code in (302, 404)
        tenant_b.refresh_from_db()
        assert tenant_b.name == "Bravo"

    def test_the_revoke_action_ignores_tenant_b_keys(self, tenant_admin, rows):
        response = tenant_admin.post(
            f"{ADMIN}/apikey/",
            {"action": "revoke_keys", "_selected_action": [rows["key_a"].pk, rows["key_b"].pk]},
        )

        assert response.status_code == 302
        rows["key_a"].refresh_from_db()
        rows["key_b"].refresh_from_db()
        assert rows["key_a"].revoked_at is not None
        assert rows["key_b"].revoked_at is None

    def test_it_cannot_add_tenants(self, tenant_admin):
        assert tenant_admin.get(f"{ADMIN}/tenant/add/").status_code == 403


class TestApiKeyAddForm:
    def test_it_offers_only_tenant_a(self, tenant_admin, rows, tenant_a):
        response = tenant_admin.get(f"{ADMIN}/apikey/add/")

        form = response.context["adminform"].form
        assert list(form.fields["tenant"].queryset) == [tenant_a]

    def test_it_offers_only_users_of_tenant_a(self, tenant_admin, rows):
        response = tenant_admin.get(f"{ADMIN}/apikey/add/")

        users = {u.username for u in response.context["adminform"].form.fields["user"].queryset}
        assert users == {"owner_a", "member_a"}

    def test_the_membership_form_offers_only_tenant_a_and_its_people(self, tenant_admin, rows, tenant_a):
        form = tenant_admin.get(f"{ADMIN}/membership/add/").context["adminform"].form

        assert list(form.fields["tenant"].queryset) == [tenant_a]
        assert {u.username for u in form.fields["user"].queryset} == {"owner_a", "member_a"}

    def test_posting_tenant_b_is_refused(self, tenant_admin, rows, tenant_b, outsider_b):
        response = tenant_admin.post(
            f"{ADMIN}/apikey/add/", {"tenant": tenant_b.pk, "user": outsider_b.pk, "name": "smuggled"}
        )

        assert response.status_code == 200
        assert "tenant" in response.context["adminform"].form.errors
        assert not ApiKey.objects.filter(name="smuggled").exists()

    def test_a_key_for_someone_outside_the_tenant_is_refused(self, tenant_admin, rows, tenant_a, outsider_b):
        response = tenant_admin.post(
            f"{ADMIN}/apikey/add/", {"tenant": tenant_a.pk, "user": outsider_b.pk, "name": "smuggled"}
        )

        assert response.status_code == 200
        assert response.context["adminform"].form.errors
        assert not ApiKey.objects.filter(name="smuggled").exists()

    def test_it_shows_the_new_key_once_and_stores_only_its_hash(self, tenant_admin, rows, tenant_a, member_a):
        response = tenant_admin.post(
            f"{ADMIN}/apikey/add/",
            {"tenant": tenant_a.pk, "user": member_a.pk, "name": "from-admin"},
            follow=True,
        )

        assert response.status_code == 200
        shown = [KEY_IN_MESSAGE.search(str(m)) for m in response.context["messages"]]
        plaintexts = [match.group(0) for match in shown if match]
        assert len(plaintexts) == 1, [str(m) for m in response.context["messages"]]
        plaintext = plaintexts[0]
        key = ApiKey.objects.get(name="from-admin")
        assert (key.tenant, key.user) == (tenant_a, member_a)
        assert key.key_hash == hashlib.sha256(plaintext.encode()).hexdigest()
        assert all(plaintext not in str(v) for v in ApiKey.objects.filter(pk=key.pk).values().get().values())

        again = tenant_admin.get(f"{ADMIN}/apikey/{key.pk}/change/")
        assert again.status_code == 200
        assert plaintext not in again.content.decode()
        assert plaintext not in tenant_admin.get(f"{ADMIN}/apikey/").content.decode()

        from rest_framework.test import APIClient

        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
        assert api.get("/api/v1/me/").json()["tenant"]["slug"] == "acme"


class TestSuperuser:
    def test_it_sees_every_tenant(self, superuser_client, rows, tenant_a, tenant_b):
        _, tenants = changelist(superuser_client, "tenant")
        _, memberships = changelist(superuser_client, "membership")
        _, keys = changelist(superuser_client, "apikey")

        assert set(tenants) == {tenant_a, tenant_b}
        assert {m.tenant_id for m in memberships} == {tenant_a.pk, tenant_b.pk}
        assert set(keys) == {rows["key_a"], rows["key_b"]}
        form = superuser_client.get(f"{ADMIN}/apikey/add/").context["adminform"].form
        assert set(form.fields["tenant"].queryset) == {tenant_a, tenant_b}
        assert superuser_client.get(f"{ADMIN}/tenant/{tenant_b.pk}/change/").status_code == 200


class TestOutsideAdmin:
    def test_a_plain_member_cannot_enter_admin(self, member_a, rows):
        assert not member_a.is_staff
        client = admin_client(member_a)

        for url in ("/admin/", f"{ADMIN}/apikey/", f"{ADMIN}/tenant/"):
            response = client.get(url)
            assert response.status_code == 302
            assert response["Location"].startswith("/admin/login/")

    def test_a_plain_member_cannot_log_in_to_admin(self, member_a):
        from ..factories import PASSWORD

        response = Client().post(
            "/admin/login/?next=/admin/", {"username": "member_a", "password": PASSWORD}, follow=True
        )

        assert response.wsgi_request.path == "/admin/login/"
        assert "_auth_user_id" not in response.wsgi_request.session

    def test_staff_without_an_admin_role_sees_no_tenancy_rows(self, member_a, rows):
        member_a.is_staff = True
        member_a.save(update_fields=["is_staff"])
        client = admin_client(member_a)

        assert client.get(f"{ADMIN}/apikey/").status_code == 403
        assert "acme-key" not in client.get("/admin/").content.decode()

    def test_tenant_b_owner_sees_only_tenant_b(self, outsider_b, rows, tenant_b):
        client = admin_client(outsider_b)

        _, tenants = changelist(client, "tenant")
        _, keys = changelist(client, "apikey")
        assert tenants == [tenant_b]
        assert keys == [rows["key_b"]]
        assert Tenant.objects.count() == 2
