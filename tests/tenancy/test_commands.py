"""Provisioning commands: create_tenant, create_user and seed_demo (CONTRACT Management commands)."""

import re
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from tenancy_app.models import Membership, Tenant

User = get_user_model()


def log_in(username: str, password: str, client: Client | None = None) -> bool:
    """Log in through the login form, as a person does (django-axes needs the request, which
    `Client.login()` does not pass to `authenticate`)."""
    client = client or Client()
    response = client.post("/accounts/login/", {"username": username, "password": password})
    return response.status_code == 302 and "_auth_user_id" in client.session


def run(*args, **options) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO(), **options)
    return out.getvalue()


class TestCreateTenant:
    def test_it_creates_a_tenant(self, db):
        output = run("create_tenant", "acme", "--name", "Acme Inc")

        tenant = Tenant.objects.get(slug="acme")
        assert tenant.name == "Acme Inc"
        assert "Created" in output and "acme" in output

    def test_it_defaults_the_name_to_the_slug(self, db):
        run("create_tenant", "solo")

        assert Tenant.objects.get(slug="solo").name == "solo"

    def test_it_is_idempotent_and_leaves_an_existing_tenant_alone(self, db):
        run("create_tenant", "acme", "--name", "Acme Inc")

        output = run("create_tenant", "acme", "--name", "Renamed")

        assert Tenant.objects.filter(slug="acme").count() == 1
        assert Tenant.objects.get(slug="acme").name == "Acme Inc"
        assert "Exists" in output

    @pytest.mark.parametrize("slug", ["Acme", "acme corp", "-acme", "acme-", "a" * 51, "acme_inc", "ünï"])
    def test_it_rejects_a_bad_slug(self, db, slug):
        with pytest.raises(CommandError, match="slug"):
            run("create_tenant", slug)

        assert not Tenant.objects.exists()


class TestCreateUser:
    @pytest.mark.parametrize("role, staff", [("owner", True), ("admin", True), ("member", False)])
    def test_it_creates_a_user_with_a_role(self, tenant_a, role, staff):
        run("create_user", "alice", "--tenant", "acme", "--role", role, "--password", "pw-for-alice-123")

        alice = User.objects.get(username="alice")
        assert Membership.objects.get(tenant=tenant_a, user=alice).role == role
        assert alice.is_staff is staff
        assert alice.is_superuser is False
        assert log_in("alice", "pw-for-alice-123")

    def test_the_default_role_is_member(self, tenant_a):
        run("create_user", "bob", "--tenant", "acme", "--password", "pw-for-bob-1234")

        assert Membership.objects.get(user__username="bob").role == "member"

    def test_it_prints_a_generated_password_once_and_it_works(self, tenant_a):
        output = run("create_user", "carol", "--tenant", "acme")

        passwords = re.findall(r"^Password: (\S+)$", output, flags=re.MULTILINE)
        assert len(passwords) == 1, output
        password = passwords[0]
        assert output.count(password) == 1
        assert len(password) >= 12
        assert log_in("carol", password)
        assert password not in User.objects.get(username="carol").password

    def test_it_does_not_print_a_password_that_was_given(self, tenant_a):
        output = run("create_user", "dave", "--tenant", "acme", "--password", "given-pw-9876")

        assert "given-pw-9876" not in output
        assert "Password" not in output

    def test_it_adds_an_existing_user_to_another_tenant(self, owner_a, tenant_b):
        output = run(
            "create_user", "owner_a", "--tenant", "bravo", "--role", "member", "--password", "pw-again-123"
        )

        assert "Updated" in output
        assert set(Membership.objects.filter(user=owner_a).values_list("tenant__slug", "role")) == {
            ("acme", "owner"),
            ("bravo", "member"),
        }
        assert User.objects.filter(username="owner_a").count() == 1

    def test_adding_an_existing_user_to_a_tenant_keeps_their_password(self, owner_a, tenant_b):
        from ..factories import PASSWORD

        output = run("create_user", "owner_a", "--tenant", "bravo")

        assert Membership.objects.filter(user=owner_a, tenant=tenant_b).exists()
        assert "Password" not in output
        assert log_in("owner_a", PASSWORD)

    def test_it_refuses_an_unknown_tenant(self, db):
        with pytest.raises(CommandError, match="create_tenant nope"):
            run("create_user", "erin", "--tenant", "nope")

        assert not User.objects.filter(username="erin").exists()

    def test_it_refuses_an_unknown_role(self, tenant_a):
        with pytest.raises(CommandError, match="role"):
            run("create_user", "frank", "--tenant", "acme", "--role", "superuser")

        assert not User.objects.filter(username="frank").exists()


class TestSeedDemo:
    @pytest.fixture(autouse=True)
    def _workspaces_in_tmp(self, settings, tmp_path):
        # seed_demo also prepares a demo Session workspace; keep it out of the project's var/.
        settings.XAGENT_WORKSPACES_DIR = tmp_path / "workspaces"

    def test_it_is_idempotent_and_prints_a_login_that_works(self, db, settings):
        settings.EMBEDDED = True  # the embedded default, whatever mode this run is in

        first = run("seed_demo")
        username, password = re.search(r"Login: (\S+) / (\S+)", first).groups()
        client = Client()
        assert log_in(username, password, client)
        second = run("seed_demo")  # `make run` seeds at every start

        assert Tenant.objects.filter(slug="demo").count() == 1
        assert User.objects.filter(username="demo").count() == 1
        assert Membership.objects.get(user__username="demo").role == "owner"
        assert "Login: demo (password unchanged" in second
        # A restart signs nobody out: the browser session made before it still works.
        response = client.get("/")
        assert response.status_code == 200
        assert "Demo workspace" in response.content.decode()

    def test_a_changed_demo_password_survives_a_re_seed(self, db, settings):
        settings.EMBEDDED = True
        run("seed_demo")
        demo = User.objects.get(username="demo")
        demo.set_password("mine-now-9876")
        demo.save()

        run("seed_demo")

        assert log_in("demo", "mine-now-9876") and not log_in("demo", "demo")

    def test_it_uses_a_given_password(self, db):
        output = run("seed_demo", "--password", "seeded-pw-4321")

        assert "Login: demo / seeded-pw-4321" in output
        assert log_in("demo", "seeded-pw-4321")

    def test_in_production_it_never_sets_a_known_password(self, db, settings):
        settings.EMBEDDED = False

        first = run("seed_demo")
        second = run("seed_demo")

        demo = User.objects.get(username="demo")
        assert not demo.has_usable_password()
        assert "changepassword" in first and not re.search(r"Login: \S+ / ", first)
        assert "password unchanged" in second
        assert not log_in("demo", "demo")
