import sys

from django.core.management.base import BaseCommand, CommandError

from tenancy_app.models import Tenant
from tools_app.secrets import set_secret


class Command(BaseCommand):
    help = "Create or replace a tenant secret. The value is read from standard input and never echoed."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--tenant", required=True, help="tenant slug")

    def handle(self, name, tenant, **options):
        tenant_obj = Tenant.objects.filter(slug=tenant).first()
        if tenant_obj is None:
            raise CommandError(f"No tenant with slug {tenant!r}.")
        value = sys.stdin.read().rstrip("\n")
        if not value:
            raise CommandError("No value on standard input.")
        try:
            set_secret(tenant_obj, name, value)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"Secret {name} saved for tenant {tenant_obj.slug}.")
