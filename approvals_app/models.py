"""Approval facts: policies (what needs a human) and pending approvals (RuntimeAuditUnits).

approvals_app sits below sessions_app, so a PendingApproval refers to its Session, turn and
messages by id; the runtime writes it in the same transaction as the suspended state.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from tenancy_app.models import TenantOwnedModel

from .choices import ApprovalStatus
from .policy_models import ApprovalPolicy, ApprovalRule  # noqa: F401  (policy facts live in their own module)


class PendingApproval(TenantOwnedModel):
    """One suspended tool call waiting for a decision, with everything an auditor needs."""

    session_id = models.UUIDField(db_index=True)
    turn_id = models.BigIntegerField()
    assistant_message_id = models.BigIntegerField(help_text="the assistant message holding the original call")
    call_id = models.CharField(max_length=200, help_text="the tool call id; its result is committed under it")
    tool = models.CharField(max_length=200)
    tool_source = models.CharField(max_length=20, blank=True)
    arguments = models.JSONField(default=dict, help_text="exactly as the model sent them")
    arguments_redacted = models.JSONField(default=dict)
    risk = models.CharField(max_length=20)
    reason = models.CharField(max_length=500)
    rule = models.JSONField(default=dict, blank=True, help_text="snapshot of the matched rule")
    remaining_call_ids = models.JSONField(
        default=list, blank=True, help_text="later calls of the batch, waiting too"
    )
    deciders = models.JSONField(default=dict, blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True)
    # Exactly-once execution of an approved call: claimed by compare-and-set before it runs.
    executed_at = models.DateTimeField(null=True, blank=True)
    execution_result = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        indexes = [models.Index(fields=["tenant", "status"])]

    def __str__(self) -> str:
        return f"{self.tool} ({self.status})"
