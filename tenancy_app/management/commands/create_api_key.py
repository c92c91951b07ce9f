from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from tenancy_app.actions import do_issue_api_key
from tenancy_app.models import Tenant


class Command(BaseCommand):
    help = "Issue an API key for a user in a tenant. Prints only the key (it is stored hashed)."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--user", required=True, help="username")
        parser.add_argument("--name", default="cli", help="a label for the key")

    def handle(self, tenant, user, name, **options):
        tenant_obj = Tenant.objects.filter(slug=tenant).first()
        if tenant_obj is None:
            raise CommandError(f"No tenant with slug {tenant!r}.")
        user_obj = get_user_model().objects.filter(username=user).first()
        if user_obj is None:
            raise CommandError(f"No user named {user!r}.")
        try:
            _, plaintext = do_issue_api_key(tenant_obj, user_obj, name)
        except ValidationError as exc:
            raise CommandError("; ".join(" ".join(v) for v in exc.message_dict.values())) from exc
        self.stdout.write(plaintext)
