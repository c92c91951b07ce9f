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
