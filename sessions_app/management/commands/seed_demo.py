import shutil
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

import skills_app
from sessions_app.models import Session
from sessions_app.runtime import brain, engine
from skills_app.models import Skill, SkillVersion
from skills_app.packaging import import_package, read_folder
from tenancy_app.actions import do_create_tenant, do_create_user
from tenancy_app.choices import Role
from tools_app.models import Tool, ToolSet

DEMO_DATA = Path(__file__).resolve().parents[2] / "demo_data"
DEMO_SKILLS = Path(skills_app.__file__).resolve().parent / "demo_data" / "skills"
DEMO_SESSION_TITLE = "Support weekly report (demo)"
DEMO_TASK = (
    "tickets.csv holds last week's support tickets. Build an HTML weekly KPI report (report.html) and a "
    "kpis.csv with the same figures, validate both, and tell me the headline numbers. "
    "Then delete the scratch file draft_to_delete.md."
)
CLEANUP_TOOLSET = "workspace-cleanup"

DEMO_TENANT = "demo"
DEMO_USER = "demo"
DEMO_PASSWORD = "demo"


class Command(BaseCommand):
    help = (
        "Create what is missing of the demo tenant, its owner login, Skills and demo Session, and "
        "change nothing that exists (`make run` runs it at every start). Prints the login."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--password",
            default=None,
            help=(
                "set the demo user's password (also on an existing user). Without it a new demo user "
                f"gets {DEMO_PASSWORD!r} in embedded mode and no usable password in production; an "
                "existing one keeps its password, so a re-seed never signs anyone out"
            ),
        )

    def handle(self, password, **options):
        explicit = password is not None
        with transaction.atomic():
            tenant, _ = do_create_tenant(DEMO_TENANT, "Demo workspace")
            existing = get_user_model().objects.filter(username=DEMO_USER).first()
            if (
                not explicit
                and settings.EMBEDDED
                and (existing is None or not existing.has_usable_password())
            ):
                # Nobody could sign in as it yet: no browser session ends by setting it.
                password = DEMO_PASSWORD
            user, created = do_create_user(DEMO_USER, tenant, Role.OWNER, password)
        skills = self._demo_skills(tenant)
        demo_session = self._demo_session(tenant, user)
        self.stdout.write(f"Demo tenant: {tenant.slug}")
        self.stdout.write(f"Demo skills: {', '.join(skills)}")
        self.stdout.write(f"Demo session: {demo_session.pk} ({DEMO_SESSION_TITLE})")
        if password is not None:
            self.stdout.write(f"Login: {DEMO_USER} / {password}")
        elif created:
            self.stdout.write(
                f"Login: {DEMO_USER} (set a password with: .venv/bin/python manage.py changepassword {DEMO_USER})"
            )
        else:
            have = "" if user.has_usable_password() else "; none is set yet"
            self.stdout.write(
                f"Login: {DEMO_USER} (password unchanged{have}: `.venv/bin/python manage.py changepassword {DEMO_USER}` sets one)"
            )

    def _demo_skills(self, tenant) -> list[str]:
        """The demo tenant's Skills (research-guide, pdf-report, csv-cleanup), imported once: a
        Skill that already exists is left as it is, so an admin's new versions survive a re-seed."""
        names = []
        for folder in sorted(path for path in DEMO_SKILLS.iterdir() if path.is_dir()):
            if not Skill.objects.filter(tenant=tenant, name=folder.name).exists():
                import_package(
                    read_folder(folder), tenant=tenant, by="seed_demo", origin=SkillVersion.Origin.SEED
                )
            names.append(folder.name)
        return names

    def _demo_session(self, tenant, user):
        """The S1 demo: a Session with tickets.csv uploaded and the report task queued (once)."""
        existing = Session.objects.for_tenant(tenant).filter(title=DEMO_SESSION_TITLE).first()
        if existing is not None:
            return existing
        # Deleting files is destructive: the default policy makes the demo wait for a person's approval.
        cleanup, _ = ToolSet.objects.get_or_create(
            tenant=tenant,
            name=CLEANUP_TOOLSET,
            defaults={"description": "Delete files from the workspace (needs approval)", "is_default": True},
        )
        cleanup.tools.add(Tool.objects.get(tenant=None, name="fs_delete_files"))
        session = engine.create_session(tenant=tenant, owner=user, title=DEMO_SESSION_TITLE)
        shutil.copy(DEMO_DATA / "tickets.csv", engine.workspace_path(session) / "tickets.csv")
        shutil.copy(DEMO_DATA / "draft_to_delete.md", engine.workspace_path(session) / "draft_to_delete.md")
        # Committed now; a worker picks it up when the stack starts (brain recovery on worker start).
        brain.submit_input(session, kind="message", text=DEMO_TASK, attachments=["tickets.csv"], user=user)
        return session
