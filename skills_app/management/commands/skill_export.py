from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from skills_app.models import Skill
from skills_app.packaging import SkillPackageError, export_to_folder, export_zip

from ._common import add_owner_arguments, resolve_tenant


class Command(BaseCommand):
    help = (
        "Export a Skill's current version: --out PATH ending in .zip writes a zip (one top folder "
        "<name>/); any other PATH is a folder that receives <name>/. Prints what it wrote."
    )

    def add_arguments(self, parser):
        parser.add_argument("name")
        add_owner_arguments(parser)
        parser.add_argument("--out", required=True, help="a .zip file, or a folder to hold <name>/")

    def handle(self, name, out, **options):
        tenant = resolve_tenant(options)
        skills = Skill.objects.filter(name=name)
        skill = (
            skills.filter(tenant__isnull=True) if tenant is None else skills.filter(tenant=tenant)
        ).first()
        if skill is None:
            owner = "global" if tenant is None else f"of tenant {tenant.slug}"
            raise CommandError(f"No {owner} Skill named {name!r}.")
        try:
            if out.endswith(".zip"):
                target = Path(out)
                if target.exists():
                    raise CommandError(f"{target} already exists.")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(export_zip(skill))
            else:
                target = export_to_folder(skill, out)
        except SkillPackageError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(str(target))
