"""Sandbox policies in admin and at run time: what lets a command out of the sandbox (the
rlimits-only fallback, the host's network) is an operator's alone, and the operator's ceilings
bound every limit a tenant admin sets."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps as global_apps
from django.test import Client

from tools_app.catalog import sandbox_limits_for
from tools_app.models import SandboxPolicy
from tools_app.sandbox.policy import SandboxLimits, within_ceilings

from ..factories import UserFactory

pytestmark = pytest.mark.django_db
ADD = "/admin/tools_app/sandboxpolicy/add/"

POLICY = {
    "name": "open",
    "filesystem": "workspace_write",
    "network": "on",
    "cpu_seconds": 30,
    "memory_mb": 1024,
    "wall_seconds": 60,
    "max_processes": 64,
    "max_file_size_mb": 50,
    "max_output_bytes": 200000,
    "is_default": "on",
}


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def root(db):
    return client_for(UserFactory(username="root", is_staff=True, is_superuser=True))


@pytest.fixture
def tenant_admin(owner_a):
    assert owner_a.is_staff and not owner_a.is_superuser
    return client_for(owner_a)


def test_a_tenant_admin_neither_sees_nor_sets_the_operator_only_fields(tenant_admin, tenant_a):
    form = tenant_admin.get(ADD)
    assert form.status_code == 200
    page = form.content.decode()
    assert 'name="fallback"' not in page and 'name="host_network"' not in page
    assert 'name="network"' in page
    assert "Wall-clock seconds for one command. At most 600 (the operator" in page
    assert 'max="600"' in page

    saved = tenant_admin.post(
        ADD, {**POLICY, "tenant": tenant_a.pk, "fallback": "rlimits_only", "host_network": "on"}
    )

    assert saved.status_code == 302
    policy = SandboxPolicy.objects.get(tenant=tenant_a, name="open")
    assert (policy.fallback, policy.host_network, policy.configured_by_operator) == ("refuse", False, False)
    limits = sandbox_limits_for(tenant_a.pk)
    assert limits.network and not limits.host_network and limits.fallback == "refuse"


def test_a_tenant_row_that_says_rlimits_only_is_not_honoured(tenant_a):
    # As a row written before the rule (or by a bulk update) would say.
    SandboxPolicy.objects.create(
        tenant=tenant_a, name="old", is_default=True, fallback="rlimits_only", host_network=True
    )
    limits = sandbox_limits_for(tenant_a.pk)
    assert (limits.fallback, limits.host_network) == ("refuse", False)


def test_an_operator_sets_them_and_a_tenant_admins_later_edit_drops_them(root, tenant_admin, tenant_a):
    answer = root.post(
        ADD, {**POLICY, "tenant": tenant_a.pk, "fallback": "rlimits_only", "host_network": "on"}
    )
    assert answer.status_code == 302
    policy = SandboxPolicy.objects.get(tenant=tenant_a, name="open")
    assert policy.configured_by_operator
    limits = sandbox_limits_for(tenant_a.pk)
    assert (limits.fallback, limits.host_network) == ("rlimits_only", True)

    # The tenant admin narrows a limit: the operator's choices stay (they did not touch them).
    edit = tenant_admin.post(
        f"/admin/tools_app/sandboxpolicy/{policy.pk}/change/",
        {**POLICY, "tenant": tenant_a.pk, "cpu_seconds": 10},
    )
    assert edit.status_code == 302
    assert sandbox_limits_for(tenant_a.pk).cpu_seconds == 10
    assert sandbox_limits_for(tenant_a.pk).fallback == "rlimits_only"

    # A save that changes an operator-only field without being the operator drops the trust.
    policy.refresh_from_db()
    policy.host_network = False
    policy.save()
    assert not policy.configured_by_operator
    assert sandbox_limits_for(tenant_a.pk).fallback == "refuse"


def test_limits_above_the_operators_ceiling_are_refused_with_the_setting_named(
    tenant_admin, tenant_a, settings
):
    settings.XAGENT_SANDBOX_CEILINGS = {**settings.XAGENT_SANDBOX_CEILINGS, "wall_seconds": 120}

    answer = tenant_admin.post(
        ADD, {**POLICY, "tenant": tenant_a.pk, "wall_seconds": 86400, "max_processes": 0}
    )

    assert answer.status_code == 200
    errors = answer.context["adminform"].form.errors
    assert "XAGENT_SANDBOX_MAX_WALL_SECONDS" in errors["wall_seconds"][0]
    assert "At least 1" in errors["max_processes"][0]
    assert not SandboxPolicy.objects.filter(tenant=tenant_a).exists()


def test_a_policy_saved_before_a_ceiling_was_lowered_is_clamped_when_applied(tenant_a, settings):
    SandboxPolicy.objects.create(
        tenant=tenant_a, name="big", is_default=True, wall_seconds=500, memory_mb=4000
    )
    settings.XAGENT_SANDBOX_CEILINGS = {**settings.XAGENT_SANDBOX_CEILINGS, "wall_seconds": 100}

    limits = sandbox_limits_for(tenant_a.pk)

    assert (limits.wall_seconds, limits.memory_mb) == (100, 4000)


def test_within_ceilings_only_lowers():
    limits = SandboxLimits(cpu_seconds=5, wall_seconds=900)
    assert within_ceilings(limits, {"cpu_seconds": 10, "wall_seconds": 600}) == SandboxLimits(
        cpu_seconds=5, wall_seconds=600
    )


def test_the_migration_resets_tenant_rows_and_trusts_global_ones(tenant_a):
    tenant_row = SandboxPolicy.objects.create(tenant=tenant_a, name="t", fallback="rlimits_only")
    global_row = SandboxPolicy.objects.create(tenant=None, name="g", fallback="rlimits_only")
    migration = importlib.import_module("tools_app.migrations.0009_sandbox_operator_fields_toolset_shell_env")

    migration.reset_tenant_fallbacks(global_apps, None)

    tenant_row.refresh_from_db()
    global_row.refresh_from_db()
    assert (tenant_row.fallback, tenant_row.configured_by_operator) == ("refuse", False)
    assert (global_row.fallback, global_row.configured_by_operator) == ("rlimits_only", True)


@pytest.mark.parametrize(
    "shell_env, error",
    [
        ('["API_TOKEN"]', "JSON object"),
        ('{"1BAD": "x"}', "not a valid environment variable name"),
        ('{"TOKEN": 42}', "must be a string"),
        ('{"TOKEN": ', "Enter a valid JSON"),
    ],
    ids=["not-an-object", "bad-name", "not-a-string", "malformed-json"],
)
def test_a_bad_shell_environment_is_a_form_error_and_nothing_is_saved(
    tenant_admin, tenant_a, shell_env, error
):
    from tools_app.models import ToolSet

    answer = tenant_admin.post(
        "/admin/tools_app/toolset/add/", {"tenant": tenant_a.pk, "name": "shell", "shell_env": shell_env}
    )

    assert answer.status_code == 200
    errors = answer.context["adminform"].form.errors
    assert error in " ".join(errors.get("shell_env", [])), errors
    assert not ToolSet.objects.filter(tenant=tenant_a, name="shell").exists()
