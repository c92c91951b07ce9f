"""Tenant isolation on the REST API: a key acts for its own tenant only, another tenant's
rows are 404 and never listed, and a browser session picks only tenants it belongs to."""

import pytest
from rest_framework.test import APIClient

from tenancy_app.access import SESSION_TENANT_KEY
from tenancy_app.choices import Role
from tenancy_app.models import ApiKey

from ..factories import TenantFactory, UserFactory, issue_key, make_member
from .isolation import (
    TenantIsolationContract,
    assert_cross_tenant_404,
    assert_error_shape,
    assert_list_excludes,
    result_ids,
)

API_KEYS = "/api/v1/api-keys/"
ME = "/api/v1/me/"


def bearer(plaintext: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


def key_row(client) -> ApiKey:
    return ApiKey.objects.get(prefix=client.api_key.split("_")[1])


def logged_in(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def owner_a_also_in_b(owner_a, tenant_b, outsider_b):
    """owner_a is also a plain member of tenant B (B's owner is outsider_b)."""
    return make_member(tenant_b, "owner_a", Role.MEMBER)


class TestApiKeyIsolation(TenantIsolationContract):
    list_url = API_KEYS
    # The api-keys route has no update: PUT/PATCH are covered by the 405 test below.
    detail_methods = ("get", "delete")

    @pytest.fixture
    def tenant_a_object(self, owner_a, tenant_a):
        key, _ = issue_key(tenant_a, owner_a, "acme-deploy-key")
        return key

    def test_tenant_b_cannot_reach_tenant_a_keys_by_any_method(self, api_outsider_b, tenant_a_object):
        assert_cross_tenant_404(
            api_outsider_b,
            self.detail_url(tenant_a_object),
            methods=self.detail_methods,
            hidden=["acme-deploy-key", "owner_a", tenant_a_object.prefix],
        )

        tenant_a_object.refresh_from_db()
        assert tenant_a_object.revoked_at is None, "tenant B's DELETE must not revoke tenant A's key"

    @pytest.mark.parametrize("method", ["put", "patch"])
    def test_updates_answer_the_same_405_whether_or_not_the_key_exists(
        self, method, api_outsider_b, api_owner_a, tenant_a_object
    ):
        # No update route: the answer comes before any lookup, so it cannot confirm the key exists.
        answers = [
            getattr(client, method)(url, {"name": "renamed"}, format="json")
            for client, url in [
                (api_outsider_b, self.detail_url(tenant_a_object)),
                (api_outsider_b, f"{API_KEYS}999999/"),
                (api_owner_a, self.detail_url(tenant_a_object)),
            ]
        ]

        for response in answers:
            assert_error_shape(response, 405, "method_not_allowed")
        assert len({response.content for response in answers}) == 1
        tenant_a_object.refresh_from_db()
        assert tenant_a_object.name == "acme-deploy-key"

    def test_tenant_b_lists_its_own_keys_and_none_of_tenant_a(
        self, api_outsider_b, api_owner_a, api_member_a
    ):
        listed = assert_list_excludes(api_outsider_b, API_KEYS, key_row(api_owner_a).pk)

        assert key_row(api_member_a).pk not in listed
        assert listed == [key_row(api_outsider_b).pk]


class TestMe:
    def test_it_reports_the_keys_tenant(self, api_owner_a, api_outsider_b):
        mine, theirs = api_owner_a.get(ME).json(), api_outsider_b.get(ME).json()

        assert (mine["username"], mine["tenant"], mine["role"]) == (
            "owner_a",
            {"slug": "acme", "name": "Acme"},
            "owner",
        )
        assert (theirs["username"], theirs["tenant"]["slug"]) == ("outsider_b", "bravo")

    def test_anonymous_callers_get_401(self, api_anonymous, tenant_a):
        assert_error_shape(api_anonymous.get(ME), 401, "not_authenticated")


class TestUserInTwoTenants:
    def test_a_key_acts_only_for_its_own_tenant(self, owner_a_also_in_b, tenant_a, tenant_b, outsider_b):
        acme_key, acme_plain = issue_key(tenant_a, owner_a_also_in_b, "acme")
        bravo_key, bravo_plain = issue_key(tenant_b, owner_a_also_in_b, "bravo")
        outsider_key, _ = issue_key(tenant_b, outsider_b, "outsider")
        acme, bravo = bearer(acme_plain), bearer(bravo_plain)

        me_acme = acme.get(ME).json()
        assert (me_acme["tenant"]["slug"], me_acme["role"]) == ("acme", "owner")
        assert {m["tenant"]["slug"] for m in me_acme["memberships"]} == {"acme", "bravo"}
        me_bravo = bravo.get(ME).json()
        assert (me_bravo["tenant"]["slug"], me_bravo["role"]) == ("bravo", "member")

        # The owner role in acme does not carry over: in bravo the user is a member.
        assert result_ids(acme, API_KEYS) == [acme_key.pk]
        assert result_ids(bravo, API_KEYS) == [bravo_key.pk]
        assert_error_shape(acme.get(f"{API_KEYS}{bravo_key.pk}/"), 404, "not_found")
        assert_error_shape(bravo.get(f"{API_KEYS}{outsider_key.pk}/"), 404, "not_found")

    def test_a_key_ignores_the_x_tenant_header(self, owner_a_also_in_b, tenant_a, tenant_b):
        acme_key, acme_plain = issue_key(tenant_a, owner_a_also_in_b, "acme")
        bravo_key, _ = issue_key(tenant_b, owner_a_also_in_b, "bravo")
        client = bearer(acme_plain)

        assert client.get(ME, HTTP_X_TENANT="bravo").json()["tenant"]["slug"] == "acme"
        ids = [row["id"] for row in client.get(API_KEYS, HTTP_X_TENANT="bravo").json()["results"]]
        assert ids == [acme_key.pk]
        created = client.post(API_KEYS, {"name": "new"}, format="json", HTTP_X_TENANT="bravo")
        assert created.status_code == 201
        assert bearer(created.json()["key"]).get(ME).json()["tenant"]["slug"] == "acme"


class TestSessionTenantChoice:
    def test_it_uses_the_first_membership_by_default(self, owner_a_also_in_b):
        me = logged_in(owner_a_also_in_b).get(ME).json()

        assert (me["tenant"]["slug"], me["auth"]) == ("acme", "session")

    def test_the_x_tenant_header_picks_a_tenant_the_user_belongs_to(
        self, owner_a_also_in_b, outsider_b, tenant_b
    ):
        bravo_key, _ = issue_key(tenant_b, outsider_b, "outsider")
        client = logged_in(owner_a_also_in_b)

        me = client.get(ME, HTTP_X_TENANT="bravo").json()

        assert (me["tenant"]["slug"], me["role"]) == ("bravo", "member")
        # A member of bravo sees only their own keys there, not the bravo owner's.
        assert bravo_key.pk not in [
            r["id"] for r in client.get(API_KEYS, HTTP_X_TENANT="bravo").json()["results"]
        ]

    def test_the_x_tenant_header_cannot_pick_a_foreign_tenant(self, owner_a, api_outsider_b, tenant_b):
        bravo_key = key_row(api_outsider_b)
        client = logged_in(owner_a)

        me = client.get(ME, HTTP_X_TENANT="bravo").json()
        assert me["tenant"]["slug"] == "acme", "an unknown choice falls back to the user's own tenant"
        assert_list_excludes(client, API_KEYS, bravo_key.pk)
        listing = client.get(API_KEYS, HTTP_X_TENANT="bravo")
        assert bravo_key.pk not in [row["id"] for row in listing.json()["results"]]
        assert_error_shape(client.get(f"{API_KEYS}{bravo_key.pk}/", HTTP_X_TENANT="bravo"), 404, "not_found")
        assert_error_shape(
            client.delete(f"{API_KEYS}{bravo_key.pk}/", HTTP_X_TENANT="bravo"), 404, "not_found"
        )
        created = client.post(API_KEYS, {"name": "x"}, format="json", HTTP_X_TENANT="bravo")
        assert bearer(created.json()["key"]).get(ME).json()["tenant"]["slug"] == "acme"

    def test_the_tenant_picked_in_the_browser_applies_to_the_api(self, owner_a_also_in_b):
        client = logged_in(owner_a_also_in_b)
        session = client.session
        session[SESSION_TENANT_KEY] = "bravo"
        session.save()

        assert client.get(ME).json()["tenant"]["slug"] == "bravo"
        assert client.get(ME, HTTP_X_TENANT="acme").json()["tenant"]["slug"] == "acme"

    def test_a_stale_browser_choice_falls_back_to_a_tenant_the_user_is_in(self, owner_a, tenant_b):
        client = logged_in(owner_a)
        session = client.session
        session[SESSION_TENANT_KEY] = "bravo"
        session.save()

        assert client.get(ME).json()["tenant"]["slug"] == "acme"

    def test_a_logged_in_user_without_a_tenant_gets_403(self, tenant_a):
        client = logged_in(UserFactory(username="drifter"))

        for url in (ME, API_KEYS):
            error = assert_error_shape(client.get(url), 403, "permission_denied")
            assert "tenant" in error["message"]
        assert_error_shape(client.get(ME, HTTP_X_TENANT="acme"), 403, "permission_denied")

    def test_each_tenant_of_a_user_keeps_its_own_role(self, owner_a_also_in_b):
        charlie = TenantFactory(slug="charlie", name="Charlie")
        # make_member re-saves the user (new password hash), so log in with the fresh row.
        client = logged_in(make_member(charlie, "owner_a", Role.ADMIN))

        slugs = {
            slug: client.get(ME, HTTP_X_TENANT=slug).json()["role"] for slug in ("acme", "bravo", "charlie")
        }

        assert slugs == {"acme": "owner", "bravo": "member", "charlie": "admin"}
