from django.db import models


class SkillSource(models.TextChoices):
    """Whose Skill it is: the tenant's own, or the operator's for every tenant (`Skill.source`)."""

    TENANT = "tenant", "Tenant"
    GLOBAL = "global", "Global"
