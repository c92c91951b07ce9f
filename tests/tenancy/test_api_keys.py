"""API keys: hashed at rest, shown once, revocable, tied to a live membership (CONTRACT Auth)."""

import hashlib
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from tenancy_app.choices import Role
from tenancy_app.models import ApiKey, Membership

from ..factories import issue_key, make_member
from .isolation import assert_error_shape, result_ids

API_KEYS = "/api/v1/api-keys/"
ME = "/api/v1/me/"


def bearer(plaintext: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


def key_row(client) -> ApiKey:
    """The ApiKey row behind a conftest API client (`xak_<prefix>_<secret>`)."""
    return ApiKey.objects.get(prefix=client.api_key.split("_")[1])


def detail(key: ApiKey) -> str:
    return f"{API_KEYS}{key.pk}/"


class TestHashing:
    def test_it_stores_only_a_hash_of_the_key(self, api_owner_a):
        response = api_owner_a.post(API_KEYS, {"name": "ci"}, format="json")

        assert response.status_code == 201, response.content
        plaintext = response.json()["key"]
        secret = plaintext.split("_", 2)[2]
        stored = ApiKey.objects.filter(pk=response.json()["id"]).values().get()
        for field, value in stored.items():
            assert plaintext not in str(value), f"plaintext key stored in {field}"
            assert secret not in str(value), f"secret part of the key stored in {field}"
        assert stored["key_hash"] == hashlib.sha256(plaintext.encode()).hexdigest()
        assert plaintext.startswith(f"xak_{stored['prefix']}_")

    def test_it_issues_a_key_that_acts_for_its_creator_in_the_creators_tenant(self, api_member_a):
        response = api_member_a.post(API_KEYS, {"name": "laptop"}, format="json")

        me = bearer(response.json()["key"]).get(ME).json()
        assert (me["username"], me["tenant"]["slug"], me["role"], me["auth"]) == (
            "member_a",
            "acme",
            "member",
            "api_key",
        )

    def test_it_ignores_attempts_to_issue_a_key_for_someone_else(self, api_member_a, owner_a, outsider_b):
        response = api_member_a.post(
            API_KEYS, {"name": "sneaky", "user": "owner_a", "tenant": "bravo"}, format="json"
        )

        assert response.status_code == 201
        key = ApiKey.objects.select_related("user", "tenant").get(pk=response.json()["id"])
        assert (key.user.username, key.tenant.slug) == ("member_a", "acme")
        assert response.json()["user"] == "member_a"

    def test_it_issues_distinct_keys(self, api_owner_a):
        first = api_owner_a.post(API_KEYS, {"name": "one"}, format="json").json()
        second = api_owner_a.post(API_KEYS, {"name": "two"}, format="json").json()

        assert first["key"] != second["key"]
        assert first["prefix"] != second["prefix"]


class TestShownOnce:
    def test_it_never_shows_the_key_again(self, api_owner_a):
        created = api_owner_a.post(API_KEYS, {"name": "ci"}, format="json").json()
        plaintext = created["key"]

        listing = api_owner_a.get(API_KEYS)
        one = api_owner_a.get(f"{API_KEYS}{created['id']}/")

        assert listing.status_code == 200 and one.status_code == 200
        assert created["id"] in [row["id"] for row in listing.json()["results"]]
        assert all("key" not in row and "key_hash" not in row for row in listing.json()["results"])
        assert "key" not in one.json() and "key_hash" not in one.json()
        assert one.json()["prefix"] == created["prefix"]
        for response in (listing, one):
            assert plaintext not in response.content.decode()
            assert plaintext.split("_", 2)[2] not in response.content.decode()


class TestRevocation:
    def test_it_revokes_a_key_with_delete(self, api_owner_a, owner_a, tenant_a):
        key, plaintext = issue_key(tenant_a, owner_a, "to-revoke")
        assert bearer(plaintext).get(ME).status_code == 200

        response = api_owner_a.delete(detail(key))

        assert response.status_code == 204
        key.refresh_from_db()
        assert key.revoked_at is not None
        error = assert_error_shape(bearer(plaintext).get(ME), 401, "authentication_failed")
        assert "revoked" in error["message"].lower()

    def test_it_accepts_revoking_twice_and_keeps_the_first_revocation_time(
        self, api_owner_a, owner_a, tenant_a
    ):
        key, _ = issue_key(tenant_a, owner_a, "twice")

        assert api_owner_a.delete(detail(key)).status_code == 204
        key.refresh_from_db()
        first_revoked_at = key.revoked_at
        assert api_owner_a.delete(detail(key)).status_code == 204

        key.refresh_from_db()
        assert key.revoked_at == first_revoked_at
        shown = api_owner_a.get(detail(key)).json()
        assert shown["is_active"] is False and shown["revoked_at"] is not None

    def test_a_key_can_revoke_itself(self, api_member_a):
        own = key_row(api_member_a)

        assert api_member_a.delete(detail(own)).status_code == 204

        assert_error_shape(api_member_a.get(ME), 401, "authentication_failed")
        assert ApiKey.objects.filter(pk=own.pk).exists(), "a revoked key stays as audit"

    def test_it_stops_working_when_its_user_leaves_the_tenant(self, api_member_a, member_a, tenant_a):
        assert api_member_a.get(ME).status_code == 200

        Membership.objects.filter(tenant=tenant_a, user=member_a).delete()

        assert_error_shape(api_member_a.get(ME), 401, "authentication_failed")

    def test_it_stops_working_when_its_user_is_deactivated(self, api_member_a, member_a):
        assert api_member_a.get(ME).status_code == 200

        member_a.is_active = False
        member_a.save(update_fields=["is_active"])

        assert_error_shape(api_member_a.get(ME), 401, "authentication_failed")


class TestAuthorizationHeader:
    @pytest.mark.parametrize(
        "header, code",
        [
            ("Bearer", "authentication_failed"),
            ("Bearer    ", "authentication_failed"),
            ("Bearer nonsense", "authentication_failed"),
            ("Bearer xak_000000000000_not-a-real-secret", "authentication_failed"),
            ("Token x", "not_authenticated"),
            ("Basic b3duZXJfYTpwdw==", "not_authenticated"),
        ],
    )
    def test_it_rejects_a_malformed_header_with_a_clear_401(self, header, code, owner_a):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)

        error = assert_error_shape(client.get(ME), 401, code)

        assert len(error["message"]) > 10
        assert client.get(ME)["WWW-Authenticate"] == 'Bearer realm="api"'

    def test_it_says_when_the_key_is_missing_after_bearer(self):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION="Bearer")

        error = assert_error_shape(client.get(ME), 401, "authentication_failed")

        assert "Bearer" in error["message"]

    def test_it_accepts_the_scheme_in_any_case(self, api_owner_a):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"bearer {api_owner_a.api_key}")

        assert client.get(ME).json()["username"] == "owner_a"

    def test_a_truncated_key_is_refused(self, api_owner_a):
        assert_error_shape(bearer(api_owner_a.api_key[:-1]).get(ME), 401, "authentication_failed")


class TestVisibility:
    def test_members_see_only_their_own_keys(self, api_owner_a, api_member_a, owner_a, tenant_a):
        owner_extra, _ = issue_key(tenant_a, owner_a, "owner-extra")

        assert result_ids(api_member_a, API_KEYS) == [key_row(api_member_a).pk]

        assert_error_shape(api_member_a.get(detail(owner_extra)), 404, "not_found")
        assert_error_shape(api_member_a.delete(detail(owner_extra)), 404, "not_found")
        owner_extra.refresh_from_db()
        assert owner_extra.revoked_at is None

    def test_owners_see_every_key_of_the_tenant(self, api_owner_a, api_member_a):
        member_key = key_row(api_member_a)

        assert set(result_ids(api_owner_a, API_KEYS)) == {key_row(api_owner_a).pk, member_key.pk}
        assert api_owner_a.get(detail(member_key)).json()["user"] == "member_a"

    def test_admins_see_every_key_of_the_tenant_too(self, api_owner_a, api_member_a, tenant_a):
        admin_a = make_member(tenant_a, "admin_a", Role.ADMIN)
        _, plaintext = issue_key(tenant_a, admin_a, "admin")

        listed = set(result_ids(bearer(plaintext), API_KEYS))

        assert {key_row(api_owner_a).pk, key_row(api_member_a).pk} < listed

    def test_an_owner_can_revoke_a_members_key(self, api_owner_a, api_member_a):
        assert api_owner_a.delete(detail(key_row(api_member_a))).status_code == 204

        assert_error_shape(api_member_a.get(ME), 401, "authentication_failed")

    def test_it_pages_the_list_with_a_cursor(self, api_owner_a, owner_a, tenant_a):
        for n in range(4):
            issue_key(tenant_a, owner_a, f"k{n}")

        first = api_owner_a.get(API_KEYS, {"page_size": 2}).json()

        assert len(first["results"]) == 2 and first["next"]
        assert len(result_ids(api_owner_a, f"{API_KEYS}?page_size=2")) == 5


class TestLastUsed:
    def test_it_records_when_a_key_was_last_used(self, api_owner_a):
        key = key_row(api_owner_a)
        assert key.last_used_at is None

        before = timezone.now()
        api_owner_a.get(ME)

        key.refresh_from_db()
        assert key.last_used_at is not None and key.last_used_at >= before - timedelta(seconds=1)
        assert api_owner_a.get(detail(key)).json()["last_used_at"] is not None

    def test_it_refreshes_last_used_at_at_most_once_a_minute(self, api_owner_a):
        key = key_row(api_owner_a)
        recent = timezone.now() - timedelta(seconds=10)
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=recent)

        api_owner_a.get(ME)
        key.refresh_from_db()
        assert key.last_used_at == recent

        stale = timezone.now() - timedelta(minutes=5)
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=stale)
        api_owner_a.get(ME)
        key.refresh_from_db()
        assert key.last_used_at > stale + timedelta(minutes=4)


class TestCreateApiKeyCommand:
    def test_it_prints_only_a_key_that_authenticates(self, owner_a):
        out = StringIO()

        call_command("create_api_key", "--tenant", "acme", "--user", "owner_a", stdout=out)

        lines = out.getvalue().splitlines()
        assert len(lines) == 1, out.getvalue()
        plaintext = lines[0]
        assert plaintext == plaintext.strip() and " " not in plaintext
        me = bearer(plaintext).get(ME)
        assert me.status_code == 200
        assert (me.json()["username"], me.json()["tenant"]["slug"]) == ("owner_a", "acme")
        stored = ApiKey.objects.values().get(user=owner_a, name="cli")
        assert stored["key_hash"] == hashlib.sha256(plaintext.encode()).hexdigest()
        assert all(plaintext not in str(value) for value in stored.values())

    @pytest.mark.parametrize(
        "tenant, user, complaint",
        [("nope", "owner_a", "nope"), ("acme", "ghost", "ghost"), ("bravo", "owner_a", "not a member")],
    )
    def test_it_refuses_unknown_tenants_users_and_non_members(
        self, owner_a, tenant_b, tenant, user, complaint
    ):
        with pytest.raises(CommandError, match=complaint):
            call_command("create_api_key", "--tenant", tenant, "--user", user, stdout=StringIO())

        assert not ApiKey.objects.exists()
