from django.db import models


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"


class PolicyAction(models.TextChoices):
    ALLOW = "allow", "Allow"
    REQUIRE_APPROVAL = "require_approval", "Require approval"
    DENY = "deny", "Deny"
