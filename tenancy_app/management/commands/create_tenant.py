from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from tenancy_app.actions import do_create_tenant


class Command(BaseCommand):
    help = "Create a tenant (idempotent: an existing slug is reported, not changed)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="")

    def handle(self, slug, name, **options):
        try:
            tenant, created = do_create_tenant(slug, name)
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from exc
        self.stdout.write(f"{'Created' if created else 'Exists'}: tenant {tenant.slug} ({tenant.name})")
