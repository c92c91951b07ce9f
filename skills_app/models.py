"""Skill facts (Agent Skills format, https://agentskills.io): a folder with a SKILL.md (YAML
frontmatter + markdown instructions) and optional resources (`scripts/`, `references/`,
`assets/`).

One owner per fact: a `SkillVersion` holds what was imported, byte for byte (the SKILL.md and
every resource file), and never changes. `Skill` is the named, enabled-or-not entry Sessions
see; its name, description, body and other fields are the parsed projection of its current
version, written only by `skills_app.packaging` when a version is added. A re-import adds a
version and keeps the history.
"""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models

from tenancy_app.models import TenantOrGlobalModel

# Agent Skills: 1-64 characters, lowercase letters, digits and single inner hyphens. (The spec
# also admits non-ASCII lowercase letters; we keep names ASCII so they are safe as folder names
# and in `skills/<name>/` paths everywhere.)
SKILL_NAME_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*$"
MAX_NAME_LENGTH = 64
MAX_DESCRIPTION_LENGTH = 1024
MAX_COMPATIBILITY_LENGTH = 500
MAX_LICENSE_LENGTH = 500
MAX_ALLOWED_TOOLS_LENGTH = 2000

skill_name_validator = RegexValidator(
    SKILL_NAME_PATTERN,
    "Use lowercase letters, digits and single hyphens, not at the start or end (e.g. pdf-reports).",
)


class Skill(TenantOrGlobalModel):
    """A Skill a tenant may use: its own (tenant set) or the operator's (tenant empty: global).
    A tenant's Skill with the same name as a global one stands in for it in that tenant."""

    name = models.CharField(max_length=MAX_NAME_LENGTH, validators=[skill_name_validator])
    description = models.TextField(max_length=MAX_DESCRIPTION_LENGTH)
    body = models.TextField(blank=True, help_text="The markdown instructions after the frontmatter.")
    license = models.CharField(max_length=MAX_LICENSE_LENGTH, blank=True)
    compatibility = models.CharField(max_length=MAX_COMPATIBILITY_LENGTH, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    allowed_tools = models.CharField(
        max_length=MAX_ALLOWED_TOOLS_LENGTH,
        blank=True,
        help_text="`allowed-tools` as written (space-separated). Informational: loading a Skill never loads tools.",
    )
    enabled = models.BooleanField(default=True, help_text="Disabled Skills are not offered to Sessions.")
    current_version = models.ForeignKey(
        "SkillVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )
    version = models.PositiveIntegerField(
        default=0, editable=False, help_text="Number of the current version."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "tenant_id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="unique_tenant_skill_name"),
            models.UniqueConstraint(
                fields=["name"], condition=models.Q(tenant__isnull=True), name="unique_global_skill_name"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def source(self) -> str:
        return "global" if self.tenant_id is None else "tenant"


class SkillVersion(models.Model):
    """One import of a Skill, immutable: the SKILL.md exactly as it arrived and its resources."""

    class Origin(models.TextChoices):
        ZIP = "zip", "Zip upload"
        PASTE = "paste", "Pasted SKILL.md"
        FOLDER = "folder", "Folder (command)"
        SEED = "seed", "Demo seed"

    skill = models.ForeignKey(Skill, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    skill_md = models.BinaryField(help_text="SKILL.md, byte for byte as imported.")
    sha256 = models.CharField(max_length=64, help_text="Digest of the whole package (SKILL.md and files).")
    origin = models.CharField(max_length=10, choices=Origin.choices)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["skill_id", "-number"]
        constraints = [models.UniqueConstraint(fields=["skill", "number"], name="unique_skill_version")]

    def __str__(self) -> str:
        return f"{self.skill.name} v{self.number}"


class SkillFile(models.Model):
    """A resource of a Skill version (`scripts/`, `references/`, `assets/`, ...), byte for byte."""

    version = models.ForeignKey(SkillVersion, on_delete=models.CASCADE, related_name="files")
    path = models.CharField(max_length=255, help_text="Relative POSIX path inside the Skill folder.")
    content = models.BinaryField()
    size = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)
    executable = models.BooleanField(default=False)

    class Meta:
        ordering = ["version_id", "path"]
        constraints = [models.UniqueConstraint(fields=["version", "path"], name="unique_skill_file_path")]

    def __str__(self) -> str:
        return self.path
