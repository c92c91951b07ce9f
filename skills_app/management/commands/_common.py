"""What `skill_import` and `skill_export` share: `--tenant SLUG` or `--global`."""

from __future__ import annotations

from django.core.management.base import CommandError

from tenancy_app.models import Tenant


def add_owner_arguments(parser) -> None:
    owner = parser.add_mutually_exclusive_group(required=True)
    owner.add_argument("--tenant", help="tenant slug")
    owner.add_argument(
        "--global", dest="is_global", action="store_true", help="the operator's Skill for every tenant"
    )


def resolve_tenant(options) -> Tenant | None:
    if options.get("is_global"):
        return None
    tenant = Tenant.objects.filter(slug=options["tenant"]).first()
    if tenant is None:
        raise CommandError(f"No tenant with slug {options['tenant']!r}.")
    return tenant
