from django.db import models


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"


# Roles that administer a tenant (Django admin for its rows, every API key of the tenant).
ADMIN_ROLES = frozenset({Role.OWNER, Role.ADMIN})
