"""Factories for test data, in one place (STYLE §9)."""

import factory
from django.contrib.auth import get_user_model

from tenancy_app.actions import do_issue_api_key, do_set_membership
from tenancy_app.choices import Role
from tenancy_app.models import Tenant

PASSWORD = "correct-horse-battery"


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"tenant-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.replace("-", " ").title())


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def save_password(obj, create, extracted, **kwargs):
        if create:
            obj.save()


def make_member(tenant, username, role=Role.MEMBER):
    user = UserFactory(username=username)
    do_set_membership(tenant, user, role)
    user.refresh_from_db()
    return user


def issue_key(tenant, user, name="test"):
    """Returns (ApiKey row, plaintext)."""
    return do_issue_api_key(tenant, user, name)


def example_stdio_fields(env: dict[str, str] | None = None) -> dict:
    """`add_server` keyword arguments that run the shipped example MCP server over stdio, in the
    process sandbox (what `manage.py mcp_server add --python-module tools_app.mcp.example_server`
    records)."""
    from tools_app.mcp.stdio import python_module_launch

    launch = python_module_launch("tools_app.mcp.example_server")
    return {
        "command": launch.command,
        "args": launch.args,
        "env": {**launch.env, **(env or {})},
        "sandbox_read_paths": launch.read_paths,
    }
