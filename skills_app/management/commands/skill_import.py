from django.core.management.base import BaseCommand, CommandError

from skills_app.packaging import SkillPackageError, import_package, read_path

from ._common import add_owner_arguments, resolve_tenant


class Command(BaseCommand):
    help = (
        "Import a Skill (a folder holding SKILL.md, or a .zip) for a tenant or, with --global, for "
        "every tenant. A changed package adds a version; an identical one changes nothing. "
        "Prints the skill name on stdout; anything else goes to stderr."
    )

    def add_arguments(self, parser):
        parser.add_argument("path", help="a skill folder or a .zip")
        add_owner_arguments(parser)

    def handle(self, path, **options):
        tenant = resolve_tenant(options)
        try:
            package, origin = read_path(path)
            result = import_package(package, tenant=tenant, by="manage.py skill_import", origin=origin)
        except SkillPackageError as exc:
            raise CommandError(str(exc)) from exc
        owner = "global" if tenant is None else f"tenant {tenant.slug}"
        what = {"created": "created", "updated": "new version", "unchanged": "unchanged"}[result.status]
        self.stderr.write(f"{result.skill.name} v{result.skill.version} ({owner}): {what}")
        self.stdout.write(result.skill.name)
