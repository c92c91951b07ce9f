import secrets

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from tenancy_app.actions import do_create_user
from tenancy_app.choices import Role
from tenancy_app.models import Tenant


class Command(BaseCommand):
    help = (
        "Create a user (or reuse an existing one) as a member of a tenant. Without --password a "
        "random password is generated and printed once."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--role", choices=Role.values, default=Role.MEMBER)
        parser.add_argument("--password", default=None)

    def handle(self, username, tenant, role, password, **options):
        tenant_obj = Tenant.objects.filter(slug=tenant).first()
        if tenant_obj is None:
            raise CommandError(
                f"No tenant with slug {tenant!r}; create it with: manage.py create_tenant {tenant}"
            )
        exists = get_user_model().objects.filter(username=username).exists()
        # An existing user keeps their password unless one is given: joining a tenant is not a reset.
        generated = password is None and not exists
        if generated:
            password = secrets.token_urlsafe(12)
        try:
            user, created = do_create_user(username, tenant_obj, role, password)
        except ValidationError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"{'Created' if created else 'Updated'}: {user.username} is {role} of {tenant_obj.slug}"
        )
        if generated:
            self.stdout.write(f"Password: {password}")
