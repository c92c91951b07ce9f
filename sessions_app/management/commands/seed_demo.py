from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction

from tenancy_app.actions import do_create_tenant, do_create_user
from tenancy_app.choices import Role

DEMO_TENANT = "demo"
DEMO_USER = "demo"
DEMO_PASSWORD = "demo"


class Command(BaseCommand):
    help = "Create the demo tenant and its owner login (idempotent). Prints the login."

    def add_arguments(self, parser):
        parser.add_argument(
            "--password", default=None, help=f"demo password (default {DEMO_PASSWORD!r} in embedded mode)"
        )

    def handle(self, password, **options):
        if password is None:
            if not settings.EMBEDDED:
                password = None  # keep whatever password the demo user already has in production
            else:
                password = DEMO_PASSWORD
        with transaction.atomic():
            tenant, _ = do_create_tenant(DEMO_TENANT, "Demo workspace")
            user, created = do_create_user(DEMO_USER, tenant, Role.OWNER, password)
        self.stdout.write(f"Demo tenant: {tenant.slug}")
        if password is not None:
            self.stdout.write(f"Login: {DEMO_USER} / {password}")
        elif created:
            self.stdout.write(
                f"Login: {DEMO_USER} (set a password with: manage.py changepassword {DEMO_USER})"
            )
        else:
            self.stdout.write(f"Login: {DEMO_USER} (password unchanged)")
